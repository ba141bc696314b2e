"""What the vLLM adapters know about vLLM: live API probes, never version strings (R29).

Everything here reads objects that exist in the running process: whether a symbol can be
imported, whether a callable takes the parameters the adapters pass, whether a class is a
subclass of the modular interface, and what the finalization-deferral attributes actually are.
A version string, a model name or a source path never decides anything; the vLLM version is
recorded in contracts as an observation only.

Deferred finalization (R29). ``use_deferred_moe_finalize`` is the *effective* boolean: a
property or attribute whose value says whether this layer's finalization really runs later.
``defer_moe_finalize`` is a *request* (a flag in some releases, a method in others); its
truthiness means nothing about execution, so it is recorded and never used to decide.
The rules, applied to every object an adapter builds or reaches:

- neither attribute exists: this vLLM has no deferred finalization; admitted;
- ``use_deferred_moe_finalize`` is a real ``bool``: ``False`` admitted, ``True`` declined
  (actually deferred execution);
- ``use_deferred_moe_finalize`` is anything else (a method, None, an int...): unknown API,
  declined;
- ``defer_moe_finalize`` exists but the effective boolean does not: the effective mode cannot
  be read, declined;
- ``defer_moe_finalize`` that is neither a flag nor a method: unknown API, declined.

This module imports neither torch nor vLLM at import time, so CPU tests exercise it with fakes.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from acquisition.adapters.base import AdapterRefusal

__all__ = [
    "EFFECTIVE_DEFERRAL",
    "LIVE_SYMBOLS",
    "MODULAR_SYMBOLS",
    "REQUEST_DEFERRAL",
    "ApiSurface",
    "CapabilityError",
    "DeferredFinalize",
    "Resolver",
    "check_parameters",
    "deferral_reasons",
    "import_resolver",
    "model_reasons",
    "probe_surface",
    "qualified_name",
    "read_deferred_finalize",
]

EFFECTIVE_DEFERRAL = "use_deferred_moe_finalize"
REQUEST_DEFERRAL = "defer_moe_finalize"

_FUSED_MOE = "vllm.model_executor.layers.fused_moe"

# Symbols the modular adapter calls, by role. A missing one is an unsupported API.
MODULAR_SYMBOLS: dict[str, str] = {
    "kernel": f"{_FUSED_MOE}.modular_kernel:FusedMoEKernel",
    "modular_prepare_finalize": f"{_FUSED_MOE}.modular_kernel:FusedMoEPrepareAndFinalizeModular",
    "modular_experts": f"{_FUSED_MOE}.modular_kernel:FusedMoEExpertsModular",
    "activation_format": f"{_FUSED_MOE}.modular_kernel:FusedMoEActivationFormat",
    "no_dp_ep": f"{_FUSED_MOE}.prepare_finalize.no_dp_ep:make_moe_prepare_and_finalize_no_dp_ep",
    "naive_dp_ep": (
        f"{_FUSED_MOE}.prepare_finalize.naive_dp_ep:make_moe_prepare_and_finalize_naive_dp_ep"
    ),
    "noop_reduction": f"{_FUSED_MOE}.topk_weight_and_reduce:TopKWeightAndReduceNoOP",
    "expert_map": f"{_FUSED_MOE}.expert_map_manager:determine_expert_map",
    "select_backend": f"{_FUSED_MOE}.oracle.unquantized:select_unquantized_moe_backend",
    "kernel_format": f"{_FUSED_MOE}.oracle.unquantized:convert_to_unquantized_kernel_format",
    "moe_config": f"{_FUSED_MOE}.config:FusedMoEConfig",
    "parallel_config": f"{_FUSED_MOE}.config:FusedMoEParallelConfig",
    "unquantized": f"{_FUSED_MOE}.config:FUSED_MOE_UNQUANTIZED_CONFIG",
    "activation": f"{_FUSED_MOE}.activation:MoEActivation",
    "router_factory": f"{_FUSED_MOE}.router.router_factory:create_fused_moe_router",
    "linear_method": "vllm.model_executor.layers.linear:UnquantizedLinearMethod",
    "workspace_init": "vllm.v1.worker.workspace:init_workspace_manager",
    "workspace_ready": "vllm.v1.worker.workspace:is_workspace_manager_initialized",
    "vllm_config": "vllm.config:VllmConfig",
    "set_vllm_config": "vllm.config:set_current_vllm_config",
}

# Symbols the live adapter calls: the engine and the forward context of a layer call.
LIVE_SYMBOLS: dict[str, str] = {
    "llm": "vllm:LLM",
    "forward_context": "vllm.forward_context:set_forward_context",
    "modular_experts": f"{_FUSED_MOE}.modular_kernel:FusedMoEExpertsModular",
    "activation_format": f"{_FUSED_MOE}.modular_kernel:FusedMoEActivationFormat",
}

# Parameters the adapters pass by keyword; a callable lacking one is an unsupported API.
MODULAR_PARAMETERS: dict[str, tuple[str, ...]] = {
    "experts.apply": (
        "output",
        "hidden_states",
        "w1",
        "w2",
        "topk_weights",
        "topk_ids",
        "activation",
        "global_num_experts",
        "expert_map",
        "a1q_scale",
        "a2_scale",
        "workspace13",
        "workspace2",
        "expert_tokens_meta",
        "apply_router_weight_on_input",
    ),
    "prepare_finalize.prepare": (
        "a1",
        "topk_weights",
        "topk_ids",
        "num_experts",
        "expert_map",
        "apply_router_weight_on_input",
        "quant_config",
        "defer_input_quant",
    ),
    "prepare_finalize.finalize": (
        "output",
        "fused_expert_output",
        "topk_weights",
        "topk_ids",
        "apply_router_weight_on_input",
        "weight_and_reduce_impl",
    ),
    "reduction.apply": (
        "output",
        "fused_expert_output",
        "topk_weights",
        "topk_ids",
        "apply_router_weight_on_input",
    ),
}


class CapabilityError(AdapterRefusal):
    """A built or reached object fails a capability check; ``reasons`` say which.

    An ``AdapterRefusal``: raised from ``build``, the CLI prints the reasons and exits as for a
    declined admission, before any samples are opened.
    """

    def __init__(self, *reasons: str, backend: str = "vllm") -> None:
        super().__init__(backend, *reasons)
        self.reasons = tuple(reasons)


Resolver = Callable[[str], Any]


def import_resolver(dotted: str) -> Any:
    """``module.path:attr`` to the live object; ImportError or AttributeError if absent."""
    module_name, _, attribute = dotted.partition(":")
    module = importlib.import_module(module_name)
    return getattr(module, attribute) if attribute else module


@dataclass(frozen=True, slots=True)
class ApiSurface:
    """The symbols found (by role) and the reasons any could not be used."""

    symbols: Mapping[str, Any]
    missing: tuple[str, ...] = field(default=())

    def __getitem__(self, role: str) -> Any:
        return self.symbols[role]

    @property
    def complete(self) -> bool:
        return not self.missing


def probe_surface(symbols: Mapping[str, str], resolve: Resolver = import_resolver) -> ApiSurface:
    """Resolve every symbol; each one that cannot be imported becomes a decline reason."""
    found: dict[str, Any] = {}
    missing: list[str] = []
    for role, dotted in symbols.items():
        try:
            found[role] = resolve(dotted)
        except ImportError as exc:
            missing.append(f"unsupported API: {dotted} cannot be imported ({exc})")
        except AttributeError:
            missing.append(f"unsupported API: {dotted} does not exist in this vLLM")
    return ApiSurface(found, tuple(missing))


def check_parameters(what: str, function: Any, required: Iterable[str]) -> list[str]:
    """Reasons ``function`` cannot be called with the keyword ``required`` parameters."""
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):
        return [f"unsupported API: the signature of {what} cannot be read"]
    parameters = signature.parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        return []
    absent = [name for name in required if name not in parameters]
    if absent:
        return [f"unsupported API: {what} takes no parameter(s) {', '.join(absent)}"]
    return []


def qualified_name(obj: Any) -> str:
    """``module.Class`` of an object or a class, for contracts and messages."""
    cls = obj if isinstance(obj, type) else type(obj)
    return f"{cls.__module__}.{cls.__qualname__}"


@dataclass(frozen=True, slots=True)
class DeferredFinalize:
    """What an object says about finalization deferral, read from its live attributes.

    ``effective_api``: ``absent``, ``bool`` (a real boolean value), ``property`` (a class
    property whose value is read on instances only) or ``unknown:<type>``. ``deferred`` is the
    effective value where it could be read. ``request_api``: ``absent``, ``flag``, ``method``
    or ``unknown:<type>``; its truthiness is deliberately not kept.
    """

    owner: str
    effective_api: str
    deferred: bool | None
    request_api: str

    def reasons(self) -> list[str]:
        where = self.owner
        if self.effective_api.startswith("unknown"):
            kind = self.effective_api.partition(":")[2]
            return [
                f"unknown capability API: {where}.{EFFECTIVE_DEFERRAL} is a {kind}, not the "
                "effective boolean the adapters audit"
            ]
        if self.request_api.startswith("unknown"):
            kind = self.request_api.partition(":")[2]
            return [
                f"unknown capability API: {where}.{REQUEST_DEFERRAL} is a {kind}, neither the "
                "request flag nor the request method"
            ]
        if self.deferred:
            return [
                f"deferred finalization: {where}.{EFFECTIVE_DEFERRAL} is True; the finalization "
                "would run outside the measured boundary"
            ]
        if self.effective_api == "absent" and self.request_api != "absent":
            return [
                f"unknown capability API: {where} has {REQUEST_DEFERRAL} (a {self.request_api}) "
                f"but no {EFFECTIVE_DEFERRAL}; the effective finalization mode cannot be read"
            ]
        return []

    def as_dict(self) -> dict[str, Any]:
        return {
            "owner": self.owner,
            "effective_api": self.effective_api,
            "deferred": self.deferred,
            "request_api": self.request_api,
        }


def _static(obj: Any, name: str) -> Any:
    cls = obj if isinstance(obj, type) else type(obj)
    try:
        return inspect.getattr_static(cls, name)
    except AttributeError:
        return _MISSING


_MISSING = object()


def read_deferred_finalize(obj: Any, owner: str | None = None) -> DeferredFinalize:
    """Read both deferral attributes of ``obj`` (an instance, or a class before build)."""
    label = owner or qualified_name(obj)
    is_class = isinstance(obj, type)

    # The effective boolean: a property on the class, read on the instance.
    static = _static(obj, EFFECTIVE_DEFERRAL)
    instance_value = _MISSING
    if not is_class:
        instance_dict = getattr(obj, "__dict__", {})
        if EFFECTIVE_DEFERRAL in instance_dict:
            instance_value = instance_dict[EFFECTIVE_DEFERRAL]
        elif static is not _MISSING:
            try:
                instance_value = getattr(obj, EFFECTIVE_DEFERRAL)
            except Exception as exc:  # a property that fails is not a readable boolean
                instance_value = exc
    if static is _MISSING and instance_value is _MISSING:
        effective_api, deferred = "absent", None
    elif is_class:
        if isinstance(static, property):
            effective_api, deferred = "property", None
        elif type(static) is bool:
            effective_api, deferred = "bool", static
        else:
            effective_api, deferred = f"unknown:{type(static).__name__}", None
    elif type(instance_value) is bool:
        effective_api, deferred = "bool", instance_value
    else:
        effective_api, deferred = f"unknown:{type(instance_value).__name__}", None

    # The request: a flag (bool) or a method; anything else is an API nobody audited.
    request = _static(obj, REQUEST_DEFERRAL)
    if not is_class and REQUEST_DEFERRAL in getattr(obj, "__dict__", {}):
        request = obj.__dict__[REQUEST_DEFERRAL]
    if request is _MISSING:
        request_api = "absent"
    elif isinstance(request, staticmethod | classmethod) or callable(request):
        request_api = "method"
    elif isinstance(request, property):
        request_api = "flag" if is_class else _request_flag_kind(obj)
    elif type(request) is bool:
        request_api = "flag"
    else:
        request_api = f"unknown:{type(request).__name__}"
    return DeferredFinalize(label, effective_api, deferred, request_api)


def _request_flag_kind(obj: Any) -> str:
    try:
        value = getattr(obj, REQUEST_DEFERRAL)
    except Exception as exc:
        return f"unknown:{type(exc).__name__}"
    if type(value) is bool:
        return "flag"
    if callable(value):
        return "method"
    return f"unknown:{type(value).__name__}"


def deferral_reasons(objects: Mapping[str, Any]) -> tuple[list[str], list[dict[str, Any]]]:
    """Read every named object; the decline reasons and the readings for the contract."""
    reasons: list[str] = []
    readings: list[dict[str, Any]] = []
    for owner, obj in objects.items():
        if obj is None:
            continue
        reading = read_deferred_finalize(obj, owner)
        readings.append(reading.as_dict())
        reasons.extend(reading.reasons())
    return reasons, readings


def model_reasons(model: Any, *, quantized_allowed: bool) -> list[str]:
    """Checkpoint properties that no vLLM adapter here can measure faithfully (R28); the rule
    lives with the other declared rules in ``acquisition.options.measurable``."""
    from acquisition.options.measurable import checkpoint_reasons

    return checkpoint_reasons(model, quantized_allowed=quantized_allowed)
