"""The MoE layer of a real vLLM engine at TP1/DP1/EP1: the ``vllm-live`` adapter (R25-R28).

The isolated component engine is a real ``vllm.LLM`` of the smallest prefix of the model that
contains a MoE layer (a layer-count override), with dummy weights, the requested token and
sequence limits kept as they are, the checkpoint's own context length, and a private KV cache
capped by ``kv_cache_memory_bytes`` (1 GiB by default; vLLM validates the context against it
or startup fails). The engine runs in this process so that its MoE layer can be reached and
called directly; the engine's processed weights, scales, activation and selected backend are
kept, never replaced by an unquantized kernel.

Components of the native forward:

- ``gate_routing``: the layer's gate projection and its router's ``select_experts`` (when the
  native kernel fuses routing, this adapter declines: no routing replay can be verified);
- ``experts``: the modular kernel's ``apply`` (native preparation, experts, finalization, the
  kernel's own output allocation) on an explicit routing stimulus; the reference is the exact
  native method ``routed_experts.forward_modular`` with the layer's own weights, compared
  exactly with every cloned bank for every stimulus;
- ``wrapper``: the parent MoE block's forward minus the gate/router and routed-kernel scopes.

Before any timing the session traces one native parent forward with those scopes marked and
checks launch ownership: each device activity belongs to exactly one innermost scope, and the
scope sums add up to the parent's total (``vllm_ownership.nested_ownership``). The wrapper is
then run with the two scopes *elided* (their callables return the outputs they produced for
the same input, launching nothing); its activities must be exactly the parent's remainder and
its output exactly the native forward's. State checks (parameter bindings, layouts, version
counters, effective MoE configuration, callable identities) run at build and before every
reference comparison; a change is an error.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import json
import os
import time
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from acquisition.adapters.base import Admission, EngineLimits, GateRoutingForward, RuntimeInfo
from acquisition.adapters.vllm_capabilities import (
    LIVE_SYMBOLS,
    CapabilityError,
    Resolver,
    deferral_reasons,
    import_resolver,
    model_reasons,
    probe_surface,
    qualified_name,
)
from acquisition.adapters.vllm_modular import UnquantizedExpertBanks
from moetables.bundle import EXPERTS

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from pathlib import Path

    from acquisition.catalog import MoeModel
    from acquisition.protocol.stimulus import RoutingStimulus
    from moetables.geometry import MoeTarget

__all__ = [
    "EngineLimits",
    "LiveMoeLayer",
    "VllmLiveBackend",
    "VllmLiveSession",
    "configure_engine_limits",
    "declared_wrapper_work",
    "effective_limits",
    "find_moe_layer",
    "model_folder",
    "smallest_moe_prefix",
]

_SEED = 20261130
DEFAULT_KV_CACHE_BYTES = 1 << 30
WRAPPER = "wrapper"


# A cap the engine checks its own allocations against; the KV cache is sized by
# kv_cache_memory_bytes, so this never decides what the engine measures.
GPU_MEMORY_UTILIZATION = 0.3

_configured_limits: EngineLimits | None = None


def configure_engine_limits(limits: EngineLimits | None) -> None:
    """Engine options the acquisition CLI does not have (attention backend, KV cache bytes,
    context length), for the registered live backend of this process.

    The command's ``--max-num-batched-tokens`` and ``--max-num-seqs`` arrive on
    ``RuntimeInfo.limits``; fields left None there are taken from here. ``vllm_cli`` sets them.
    """
    global _configured_limits
    _configured_limits = limits


def effective_limits(runtime: RuntimeInfo, own: EngineLimits | None = None) -> EngineLimits | None:
    """The runtime's limits, with the fields it leaves open filled from the adapter's options."""
    extra = own or _configured_limits
    base = runtime.limits or extra
    if base is None:
        return None

    def pick(name: str) -> Any:
        value = getattr(base, name)
        return value if value is not None or extra is None else getattr(extra, name)

    return EngineLimits(
        max_num_batched_tokens=base.max_num_batched_tokens,
        max_num_seqs=base.max_num_seqs,
        max_model_len=pick("max_model_len"),
        kv_cache_memory_bytes=pick("kv_cache_memory_bytes") or DEFAULT_KV_CACHE_BYTES,
        attention_backend=pick("attention_backend"),
    )


def declared_wrapper_work(model: MoeModel) -> bool:
    """Whether the checkpoint declares work of the parent block beyond gate and experts.

    Shared experts run in the wrapper boundary; a checkpoint without them and without a
    latent projection leaves the parent block with no native work of its own at TP1, which the
    build-time ownership trace then confirms (and refuses the build if it finds otherwise).
    """
    if model.shared_experts:
        return True
    try:
        config = json.loads((model_folder(model) / "config.json").read_text())
    except (OSError, ValueError, CapabilityError):
        return False
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    return bool(text.get("shared_expert_intermediate_size") or text.get("moe_latent_size"))


def model_folder(model: MoeModel) -> Path:
    """The folder holding the model's config.json (catalog entry or local folder)."""
    from pathlib import Path

    from acquisition.catalog import CATALOG_ROOT

    if model.source == "catalog":
        return CATALOG_ROOT / model.name
    if model.source.startswith("local:"):
        return Path(model.source.removeprefix("local:"))
    raise CapabilityError(f"{model.name}: no local folder with config.json is known")


def register_model_classes(architectures: list[str]) -> list[str]:
    """Give vLLM's model registry the checkpoint's model classes, inspected in this process.

    vLLM inspects a lazily registered model class in a fresh Python subprocess (so that a
    parent which never touched CUDA stays fork-safe), which imports vLLM and torch again:
    about 20 s of a 45 s engine start on the H200 host, on every fresh machine (the result
    is cached on disk, but a lent machine starts empty). This process has initialised CUDA
    already, so the reason does not apply: the very class the registry would load
    (``load_model_cls``) is registered through vLLM's public ``register_model``, which
    inspects it here. Returns the architectures registered; nothing where vLLM's registry
    is not reachable (the engine then inspects as usual).
    """
    try:
        from vllm import ModelRegistry
    except Exception:
        return []
    done = []
    for arch in architectures:
        entry = getattr(ModelRegistry, "models", {}).get(arch)
        if entry is None or not callable(getattr(entry, "load_model_cls", None)):
            continue
        try:
            ModelRegistry.register_model(arch, entry.load_model_cls())
        except Exception:  # the engine's own inspection still runs; never fatal here
            continue
        done.append(arch)
    return done


def smallest_moe_prefix(config: dict[str, Any]) -> int:
    """Layers up to and including the first MoE layer, from the checkpoint's declarations."""
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    layers = int(text.get("num_hidden_layers") or 1)
    dense_first = int(text.get("first_k_dense_replace") or 0)
    step = int(text.get("decoder_sparse_step") or 1)
    mlp_only = set(text.get("mlp_only_layers") or [])
    for index in range(dense_first, layers):
        if index not in mlp_only and (index + 1) % step == 0:
            return index + 1
    raise CapabilityError("config.json declares no MoE layer")


@dataclass(frozen=True, slots=True)
class LiveMoeLayer:
    """The engine's MoE layer: its parent block, runner and the runner's parts."""

    path: str
    parent: Any
    runner: Any
    routed_experts: Any
    router: Any
    gate: Any
    quant_method: Any
    kernel: Any


def find_moe_layer(model: Any) -> LiveMoeLayer:
    """The first module shaped like a modular MoE runner (found by structure, not by name)."""
    modules = dict(model.named_modules())
    for path, module in modules.items():
        routed = getattr(module, "routed_experts", None)
        router = getattr(module, "router", None)
        if routed is None or router is None or not hasattr(module, "moe_config"):
            continue
        parent_path = path.rpartition(".")[0]
        parent = modules.get(parent_path)
        if parent is None:
            raise CapabilityError(f"MoE runner {path} has no parent block to run as the wrapper")
        gate = getattr(module, "gate", None) or getattr(parent, "gate", None)
        quant_method = getattr(routed, "quant_method", None)
        return LiveMoeLayer(
            path=path,
            parent=parent,
            runner=module,
            routed_experts=routed,
            router=router,
            gate=gate,
            quant_method=quant_method,
            kernel=getattr(quant_method, "moe_kernel", None),
        )
    raise CapabilityError(
        "no module has the modular MoE runner shape (routed_experts, router, moe_config)"
    )


def _value(obj: Any, name: str, default: Any = None) -> Any:
    value = getattr(obj, name, default)
    return value() if callable(value) else value


def layer_reasons(layer: LiveMoeLayer, model: MoeModel, surface: Any) -> list[str]:
    """R25, R27, R28: every state of the engine's layer the live adapter cannot verify."""
    reasons: list[str] = []
    runner, routed, quant = layer.runner, layer.routed_experts, layer.quant_method
    config = runner.moe_config
    if (_value(config, "tp_size"), _value(config, "dp_size"), _value(config, "ep_size")) != (
        1,
        1,
        1,
    ):
        reasons.append(
            "the engine's MoE layer is not TP1/DP1/EP1 "
            f"(tp={_value(config, 'tp_size')} dp={_value(config, 'dp_size')} "
            f"ep={_value(config, 'ep_size')})"
        )
    if _value(config, "use_ep"):
        reasons.append("expert parallelism is enabled in the engine")
    if _value(config, "is_sequence_parallel"):
        reasons.append(
            "the engine's MoE layer is sequence-parallel: the token layout is not standard"
        )
    if getattr(routed, "expert_map", None) is not None:
        reasons.append("the layer holds an expert map: not every expert is local")
    parallel = getattr(config, "moe_parallel_config", None)
    if getattr(runner, "eplb_state", None) is not None or getattr(parallel, "enable_eplb", False):
        reasons.append("EPLB is enabled (R28)")
    if getattr(routed, "global_num_experts", model.global_experts) != model.global_experts:
        reasons.append(
            f"redundant experts: the layer has {routed.global_num_experts} physical experts for "
            f"{model.global_experts} logical ones (R28)"
        )
    if getattr(config, "is_lora_enabled", False):
        reasons.append("LoRA is enabled (R28)")
    if getattr(config, "has_bias", False):
        reasons.append("biased experts (R28)")
    if getattr(routed, "apply_router_weight_on_input", False):
        reasons.append("input-weighted routing: router weights are applied to the input (R28)")
    if getattr(runner, "_fse_fuse_gate", False):
        reasons.append("fused shared gate: the shared-expert gate is fused into the router (R28)")
    hidden_dim = getattr(config, "hidden_dim", model.hidden_size)
    unpadded = getattr(config, "hidden_dim_unpadded", hidden_dim)
    if (
        hidden_dim != unpadded
        or hidden_dim != model.hidden_size
        or getattr(config, "intermediate_pad", None)
    ):
        reasons.append(
            f"padded hidden dimensions (hidden {hidden_dim}, unpadded {unpadded}, "
            f"intermediate pad {getattr(config, 'intermediate_pad', None)}) (R28)"
        )
    per_partition = getattr(config, "intermediate_size_per_partition", None)
    if per_partition is not None and per_partition != getattr(
        config, "intermediate_size", per_partition
    ):
        reasons.append("tensor-sharded experts: the intermediate width is split (R28)")
    if layer.gate is None:
        reasons.append("the MoE layer has no gate module to replay")
    if quant is None or layer.kernel is None:
        reasons.append("the layer's quant method holds no modular kernel (unsupported API)")
    else:
        if _value(quant, "is_monolithic"):
            reasons.append(
                "monolithic kernel: routing runs inside the native kernel and it exposes no "
                "verifiable routing replay (R25)"
            )
        experts = getattr(layer.kernel, "fused_experts", None)
        if experts is not None and not isinstance(experts, surface["modular_experts"]):
            reasons.append(f"native experts {qualified_name(experts)} are not modular experts")
        prepare = getattr(layer.kernel, "prepare_finalize", None)
        standard = surface["activation_format"].Standard
        if prepare is not None and getattr(prepare, "activation_format", standard) != standard:
            reasons.append("the native prepare/finalize uses a batched activation layout")
        quant_config = getattr(experts, "quant_config", None)
        if quant_config is not None and getattr(quant_config, "is_quantized", False):
            reasons.append(
                "quantized processed weights: per-bank cloning of the scales held in the "
                "kernel's quant config is not implemented by this adapter yet"
            )
    if not callable(getattr(layer.router, "select_experts", None)):
        reasons.append(f"router {qualified_name(layer.router)} has no select_experts")
    deferral, _ = deferral_reasons(_deferral_owners(layer))
    reasons += deferral
    return reasons


def _deferral_owners(layer: LiveMoeLayer) -> dict[str, Any]:
    return {
        "runner": layer.runner,
        "routed_experts": layer.routed_experts,
        "quant_method": layer.quant_method,
        "moe_kernel": layer.kernel,
        "moe_config": getattr(layer.runner, "moe_config", None),
    }


def state_snapshot(layer: LiveMoeLayer) -> dict[str, Any]:
    """Bindings, layouts and version counters of the layer's parameters, the effective MoE
    configuration and the identities of the callables the components run (R27).

    Not a checksum of device memory: an in-place CUDA write that bumps no version counter
    is not detected.
    """
    params = {}
    for name, p in layer.parent.named_parameters():
        params[name] = (
            p.data_ptr(),
            tuple(p.shape),
            tuple(p.stride()),
            str(p.dtype),
            str(p.device),
            int(getattr(p, "_version", 0)),
        )
    config = layer.runner.moe_config
    try:
        effective = repr(dataclasses.asdict(config))
    except TypeError:
        effective = repr(config)
    callables = {}
    for owner, name in (
        (layer.runner, "forward"),
        (layer.router, "select_experts"),
        (layer.routed_experts, "forward_modular"),
        (layer.quant_method, "apply"),
        (layer.kernel, "apply"),
        (layer.gate, "forward"),
        (layer.parent, "forward"),
    ):
        attr = getattr(owner, name, None)
        callables[f"{type(owner).__name__}.{name}"] = (
            id(getattr(attr, "__func__", attr)),
            name in getattr(owner, "__dict__", {}),
        )
    classes = {
        "kernel.impl": qualified_name(getattr(layer.kernel, "impl", None)),
        "kernel.fused_experts": qualified_name(getattr(layer.kernel, "fused_experts", None)),
        "kernel.prepare_finalize": qualified_name(getattr(layer.kernel, "prepare_finalize", None)),
    }
    return {"parameters": params, "moe_config": effective, "callables": callables, **classes}


def _state_difference(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    changed = []
    for key, value in before.items():
        now = after.get(key)
        if isinstance(value, dict) and isinstance(now, dict):
            label = "parameter" if key == "parameters" else "callable"
            changed += [f"{label} {name}" for name in value if now.get(name) != value[name]]
            changed += [f"new {label} {name}" for name in now.keys() - value.keys()]
        elif value != now:
            changed.append(key)
    return changed


class VllmLiveBackend:
    """Admits the engine's own MoE layer at TP1/DP1/EP1 (quantized and shared experts too)."""

    name: ClassVar[str] = "vllm-live"
    native: ClassVar[bool] = True

    def __init__(
        self,
        limits: EngineLimits | None = None,
        resolve: Resolver = import_resolver,
        engine_factory: Callable[..., Any] | None = None,
    ) -> None:
        self._limits = limits
        self._resolve = resolve
        self._engine_factory = engine_factory

    def components(self, model: MoeModel, target: MoeTarget) -> tuple[str, ...]:
        """gate_routing and experts; the wrapper where the checkpoint declares work for it.

        A wrapper boundary that launches nothing cannot be a table row (times must be
        positive); the build-time ownership trace verifies the declaration either way.
        """
        if declared_wrapper_work(model):
            return ("gate_routing", EXPERTS, WRAPPER)
        return ("gate_routing", EXPERTS)

    def admit(self, model: MoeModel, target: MoeTarget, runtime: RuntimeInfo) -> Admission:
        reasons: list[str] = []
        if (target.tp, target.dp, target.ep) != (1, 1, 1) or target.sequence_parallel:
            reasons.append(
                f"target TP{target.tp}/DP{target.dp}/EP{target.ep}: the live path measures the "
                "engine's layer at TP1/DP1/EP1 only (R25)"
            )
        if runtime.device != "cuda" or not runtime.accelerator_available:
            reasons.append("needs a CUDA device: the component engine is a vLLM GPU engine")
        reasons += model_reasons(model, quantized_allowed=True)
        if effective_limits(runtime, self._limits) is None:
            reasons.append(
                "engine limits (max batched tokens, max sequences) were not supplied to the "
                "live adapter; it never starts an engine with guessed limits (R31)"
            )
        try:
            folder = model_folder(model)
            config = json.loads((folder / "config.json").read_text())
            if not config.get("architectures"):
                reasons.append(
                    f"{folder}/config.json names no architectures: vLLM cannot build the model"
                )
            else:
                smallest_moe_prefix(config)
        except (CapabilityError, OSError, ValueError) as exc:
            reasons.append(f"model folder: {exc}")
        try:
            self._resolve("vllm")
        except Exception as exc:
            reasons.append(f"vLLM is not importable here: {type(exc).__name__}: {exc}")
            return Admission.decline(self.name, *reasons)
        surface = probe_surface(LIVE_SYMBOLS, self._resolve)
        reasons += surface.missing
        if reasons:
            return Admission.decline(self.name, *reasons)
        return Admission.accept(self.name)

    def build(
        self, model: MoeModel, target: MoeTarget, runtime: RuntimeInfo, dtype: str
    ) -> VllmLiveSession:
        limits = effective_limits(runtime, self._limits)
        if limits is None:
            raise CapabilityError(
                "engine limits were not supplied to the live adapter", backend=self.name
            )
        return VllmLiveSession(
            model,
            target,
            runtime,
            dtype,
            limits,
            probe_surface(LIVE_SYMBOLS, self._resolve),
            engine_factory=self._engine_factory,
            components=self.components(model, target),
        )


@dataclass(slots=True)
class _Prepared:
    hidden: Any
    topk_ids: Any
    topk_weights: Any


class _GateRouting(GateRoutingForward):
    def __init__(self, session: VllmLiveSession, rows: int) -> None:
        super().__init__(session, rows)
        self._live = session

    def reference(self) -> Any:
        # The engine's own layer: its parameters must not have moved since the build.
        self._live.check_state()
        return super().reference()


class _Wrapper:
    """The parent forward with the gate/router and routed-kernel scopes elided."""

    def __init__(self, session: VllmLiveSession, rows: int) -> None:
        self._session = session
        self._hidden = session.random((rows, session.hidden), seed=rows + 3)
        self._scopes = session.scope_outputs(self._hidden)

    def run(self) -> Any:
        return self._session.elided_forward(self._hidden, self._scopes)

    def reference(self) -> Any:
        self._session.check_state()
        return self._session.native_forward(self._hidden.clone())


class VllmLiveSession(UnquantizedExpertBanks):
    """A component engine and the native callables of its MoE layer."""

    def __init__(
        self,
        model: MoeModel,
        target: MoeTarget,
        runtime: RuntimeInfo,
        dtype: str,
        limits: EngineLimits,
        surface: Any,
        *,
        engine_factory: Callable[..., Any] | None = None,
        components: tuple[str, ...] = ("gate_routing", EXPERTS, WRAPPER),
        check_ownership: bool = True,
        ownership_tokens: tuple[int, ...] | None = None,
    ) -> None:
        import torch

        if not surface.complete:
            raise CapabilityError(*surface.missing)
        self._torch = torch
        self.model = model
        self.target = target
        self.dtype_name = dtype
        self.limits = limits
        self.surface = surface
        self.hidden = model.hidden_size
        # What the plan times (VllmLiveBackend.components); checked against the traces below.
        self.components: tuple[str, ...] = tuple(components)
        self.banks: list[tuple[Any, Any]] = []
        self.ownership: list[dict[str, Any]] = []
        self.engine_settings: dict[str, Any] = {}
        # Seconds of the build's own phases, for the acquisition's phase table (issue 19).
        self.build_phases: dict[str, float] = {}
        started = time.perf_counter()
        self._engine = self._start_engine(engine_factory)
        self.build_phases["build.engine_start"] = (
            time.perf_counter() - started - self.build_phases.get("build.model_info", 0.0)
        )
        self.layer = self._reach_layer()
        reasons = layer_reasons(self.layer, model, surface)
        if reasons:
            raise CapabilityError(*reasons)
        _, self.deferral_readings = deferral_reasons(_deferral_owners(self.layer))
        weights = self.layer.routed_experts
        self.w13, self.w2 = weights.w13_weight, weights.w2_weight
        self.device = self.w13.device
        self.dtype = self.w13.dtype
        self.topk_dtype = _value(self.layer.quant_method, "topk_indices_dtype") or torch.int32
        self._state = state_snapshot(self.layer)
        self.observations: dict[str, Any] = {}
        probe = self.random((8, self.hidden), seed=5)
        logits = self.gate_logits(probe)
        self.observations["router_logits_dtype"] = str(logits.dtype).removeprefix("torch.")
        if check_ownership:
            started = time.perf_counter()
            tokens = ownership_tokens or tuple(
                sorted({1, min(256, limits.max_num_batched_tokens), limits.max_num_batched_tokens})
            )
            for n in tokens:
                self.ownership.append(self._check_ownership(n))
            self._check_wrapper_declaration()
            self.build_phases["build.ownership_traces"] = time.perf_counter() - started
        self.check_state()

    # -- the engine -----------------------------------------------------------------------

    def _start_engine(self, engine_factory: Callable[..., Any] | None) -> Any:
        folder = model_folder(self.model)
        config = json.loads((folder / "config.json").read_text())
        prefix = smallest_moe_prefix(config)
        text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
        max_model_len = self.limits.max_model_len or int(
            text.get("max_position_embeddings") or 4096
        )
        # The engine must run in this process for its layer to be called directly.
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        arguments: dict[str, Any] = {
            "model": str(folder),
            "load_format": "dummy",
            "hf_overrides": {"num_hidden_layers": prefix},
            "enforce_eager": True,
            "max_model_len": max_model_len,
            "max_num_batched_tokens": self.limits.max_num_batched_tokens,
            "max_num_seqs": self.limits.max_num_seqs,
            "kv_cache_memory_bytes": self.limits.kv_cache_memory_bytes or DEFAULT_KV_CACHE_BYTES,
            "gpu_memory_utilization": GPU_MEMORY_UTILIZATION,
            "skip_tokenizer_init": True,
            "generation_config": "vllm",
            "dtype": self.dtype_name,
            "tensor_parallel_size": 1,
            "data_parallel_size": 1,
        }
        if self.limits.attention_backend:
            arguments["attention_backend"] = self.limits.attention_backend
        factory = engine_factory or self.surface["llm"]
        inspected: list[str] = []
        if engine_factory is None:
            started = time.perf_counter()
            inspected = register_model_classes(config.get("architectures") or [])
            self.build_phases["build.model_info"] = time.perf_counter() - started
        engine = factory(**arguments)
        self.engine_settings = {
            "requested": {k: v for k, v in arguments.items() if k != "model"},
            "model_classes_inspected_in_process": inspected,
            "model_folder": str(folder),
            "smallest_moe_prefix_layers": prefix,
            "multiprocessing": os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING"),
        }
        self.engine_settings["actual"] = self._actual_settings(engine)
        return engine

    @staticmethod
    def _actual_settings(engine: Any) -> dict[str, Any]:
        """What the engine really runs with (observations for the contract, R31)."""
        config = getattr(getattr(engine, "llm_engine", None), "vllm_config", None)
        if config is None:
            return {}
        scheduler = getattr(config, "scheduler_config", None)
        model = getattr(config, "model_config", None)
        cache = getattr(config, "cache_config", None)
        compilation = getattr(config, "compilation_config", None)
        return {
            "max_num_batched_tokens": getattr(scheduler, "max_num_batched_tokens", None),
            "max_num_seqs": getattr(scheduler, "max_num_seqs", None),
            "max_model_len": getattr(model, "max_model_len", None),
            "enforce_eager": getattr(model, "enforce_eager", None),
            "dtype": str(getattr(model, "dtype", None)).removeprefix("torch."),
            "kv_cache_memory_bytes": getattr(cache, "kv_cache_memory_bytes", None),
            "num_gpu_blocks": getattr(cache, "num_gpu_blocks", None),
            "block_size": getattr(cache, "block_size", None),
            "cudagraph_mode": str(getattr(compilation, "cudagraph_mode", None)),
        }

    def _vllm_config(self) -> Any:
        return getattr(getattr(self._engine, "llm_engine", None), "vllm_config", None)

    def _reach_layer(self) -> LiveMoeLayer:
        models = self._engine.apply_model(lambda model: model)
        model = models[0] if isinstance(models, list | tuple) else models
        if not hasattr(model, "named_modules"):
            raise CapabilityError(
                "apply_model did not return the in-process model (is the engine running in "
                "worker processes?)"
            )
        return find_moe_layer(model)

    @contextlib.contextmanager
    def forward_context(self, tokens: int) -> Iterator[None]:
        config = self._vllm_config()
        if config is None:
            yield
            return
        with self.surface["forward_context"](None, config, num_tokens=tokens):
            yield

    # -- native callables -------------------------------------------------------------------

    def random(self, shape: tuple[int, ...], *, seed: int, scale: float = 1.0) -> Any:
        torch = self._torch
        generator = torch.Generator(device=self.device).manual_seed(_SEED + seed)
        values = torch.randn(shape, generator=generator, device=self.device, dtype=torch.float32)
        return (values * scale).to(self.dtype)

    def gate_logits(self, hidden: Any) -> Any:
        out = self.layer.gate(hidden)
        return out[0] if isinstance(out, tuple) else out

    def gate_routing(self, hidden: Any) -> tuple[Any, Any]:
        logits = self.gate_logits(hidden)
        return tuple(
            self.layer.router.select_experts(
                hidden_states=hidden, router_logits=logits, topk_indices_dtype=self.topk_dtype
            )
        )

    def native_forward(self, hidden: Any) -> Any:
        with self.forward_context(hidden.shape[0]):
            return self.layer.parent(hidden)

    def scope_outputs(self, hidden: Any) -> dict[str, Any]:
        """What the gate/router and routed-kernel scopes return inside one native forward."""
        recorded: dict[str, Any] = {}

        def record(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
            def call(*args: Any, **kwargs: Any) -> Any:
                result = fn(*args, **kwargs)
                recorded[name] = result
                return result

            return call

        with self._patched(
            gate=lambda f: record("gate", f),
            router=lambda f: record("router", f),
            experts=lambda f: record("experts", f),
        ):
            self.native_forward(hidden)
        missing = {"gate", "router", "experts"} - recorded.keys()
        if missing:
            raise CapabilityError(
                f"the parent forward never called the {', '.join(sorted(missing))} scope(s): "
                "the layer does not run the modular path this adapter audits"
            )
        return recorded

    def elided_forward(self, hidden: Any, scopes: dict[str, Any]) -> Any:
        """The parent forward whose gate/router and routed-kernel scopes launch nothing."""
        with self._patched(
            gate=lambda f: lambda *a, **k: scopes["gate"],
            router=lambda f: lambda *a, **k: scopes["router"],
            experts=lambda f: lambda *a, **k: scopes["experts"],
        ):
            return self.native_forward(hidden)

    @contextlib.contextmanager
    def _patched(
        self, **wrappers: Callable[[Callable[..., Any]], Callable[..., Any]]
    ) -> Iterator[None]:
        """Temporarily wrap scope callables as instance attributes; always restored."""
        targets = {
            "gate": (self.layer.gate, "forward"),
            "router": (self.layer.router, "select_experts"),
            "experts": (self.layer.routed_experts, "forward_modular"),
        }
        installed = []
        try:
            for key, wrap in wrappers.items():
                owner, name = targets[key]
                if name in owner.__dict__:
                    raise CapabilityError(f"{type(owner).__name__}.{name} is already patched")
                original = getattr(owner, name)
                setattr(owner, name, wrap(original))
                installed.append((owner, name))
            yield
        finally:
            for owner, name in installed:
                owner.__dict__.pop(name, None)

    def _check_ownership(self, tokens: int) -> dict[str, Any]:
        """One traced native forward: ownership per scope, conservation, the elided wrapper."""
        from acquisition.adapters.vllm_ownership import nested_ownership, trace

        hidden = self.random((tokens, self.hidden), seed=tokens + 17)
        scopes = self.scope_outputs(hidden)

        def native(capture: Any) -> None:
            def region(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
                def call(*args: Any, **kwargs: Any) -> Any:
                    with capture.region(name):
                        return fn(*args, **kwargs)

                return call

            with (
                self._patched(
                    gate=lambda f: region("gate", f),
                    router=lambda f: region("router", f),
                    experts=lambda f: region("experts", f),
                ),
                capture.region("parent"),
            ):
                self.native_forward(hidden)

        def elided(capture: Any) -> None:
            with capture.region(WRAPPER):
                self.elided_forward(hidden, scopes)

        owned = nested_ownership(trace(native))
        wrapper = nested_ownership(trace(elided))
        remainder = Counter(owned.per_scope_names.get("parent", []))
        elided_names = Counter(wrapper.per_scope_names.get(WRAPPER, []))
        if remainder != elided_names:
            raise CapabilityError(
                f"wrapper elision at {tokens} tokens does not reproduce the parent's own "
                f"activities: parent remainder {dict(remainder)}, elided {dict(elided_names)}"
            )
        native_out = self.native_forward(hidden.clone())
        elided_out = self.elided_forward(hidden, scopes)
        if not self._torch.equal(native_out, elided_out):
            raise CapabilityError(
                f"the elided wrapper's output differs from the native forward at {tokens} tokens"
            )
        scope_us = {k: v / 1000.0 for k, v in owned.per_scope_ns.items()}
        gate_routing = scope_us.get("gate", 0.0) + scope_us.get("router", 0.0)
        return {
            "tokens": tokens,
            "native_forward_total_us": owned.total_ns / 1000.0,
            "outside_scopes_us": owned.outside_ns / 1000.0,
            "gate_routing_us": gate_routing,
            "experts_us": scope_us.get("experts", 0.0),
            "wrapper_us": scope_us.get("parent", 0.0),
            "activities": {
                "gate": dict(Counter(owned.per_scope_names.get("gate", []))),
                "router": dict(Counter(owned.per_scope_names.get("router", []))),
                "experts": dict(Counter(owned.per_scope_names.get("experts", []))),
                "wrapper": dict(remainder),
            },
            "note": "router under dummy weights: the routing of this trace is not a stimulus",
        }

    def _check_wrapper_declaration(self) -> None:
        """The planned components must match what the traced parent forward launches."""
        busy = [o["tokens"] for o in self.ownership if o["activities"]["wrapper"]]
        if busy and WRAPPER not in self.components:
            raise CapabilityError(
                f"the parent block launches its own work at {busy} tokens but the checkpoint "
                "declares none; the wrapper would be missing from the table",
                backend=VllmLiveBackend.name,
            )
        if not busy and WRAPPER in self.components:
            raise CapabilityError(
                "the wrapper boundary launches no device activity at any traced token count; "
                "a table row cannot be zero (R22's rule for empty boundaries)",
                backend=VllmLiveBackend.name,
            )

    def check_state(self) -> None:
        changed = _state_difference(self._state, state_snapshot(self.layer))
        if changed:
            raise CapabilityError(
                f"the engine's MoE layer state changed during acquisition: {', '.join(changed)}"
            )

    def _kernel_apply(self, prepared: _Prepared, w13: Any, w2: Any) -> Any:
        routed = self.layer.routed_experts
        return self.layer.kernel.apply(
            hidden_states=prepared.hidden,
            w1=w13,
            w2=w2,
            topk_weights=prepared.topk_weights,
            topk_ids=prepared.topk_ids,
            activation=routed.activation,
            global_num_experts=routed.global_num_experts,
            expert_map=routed.expert_map,
            apply_router_weight_on_input=routed.apply_router_weight_on_input,
        )

    # -- the ComponentSession interface ---------------------------------------------------

    def describe(self) -> dict[str, Any]:
        try:
            import vllm

            vllm_version = str(vllm.__version__)
        except Exception:  # recorded only; never decides anything
            vllm_version = None
        layer = self.layer
        experts = getattr(layer.kernel, "fused_experts", None)
        prepare = getattr(layer.kernel, "prepare_finalize", None)
        backend = getattr(layer.quant_method, "unquantized_backend", None)
        return {
            "name": VllmLiveBackend.name,
            "native": True,
            "implementation": f"{__name__}.VllmLiveSession",
            "vllm_version": vllm_version,
            "engine": self.engine_settings,
            "layer_path": layer.path,
            "parent_class": qualified_name(layer.parent),
            "runner_class": qualified_name(layer.runner),
            "router_class": qualified_name(layer.router),
            "gate_class": qualified_name(layer.gate),
            "quant_method_class": qualified_name(layer.quant_method),
            "kernel_class": qualified_name(layer.kernel),
            "expert_class": qualified_name(experts),
            "prepare_finalize_class": qualified_name(prepare),
            "native_backend": str(getattr(backend, "value", backend)),
            "weights": "the engine's dummy-loaded, natively processed weights (no substitution)",
            "expert_layout": {
                "w13": {"shape": list(self.w13.shape), "stride": list(self.w13.stride())},
                "w2": {"shape": list(self.w2.shape), "stride": list(self.w2.stride())},
            },
            "activation": str(getattr(layer.routed_experts, "activation", None)),
            "dtypes": {
                "hidden_states": self.dtype_name,
                "expert_weights": str(self.w13.dtype).removeprefix("torch."),
                "gate_weight": str(getattr(layer.gate, "weight", self.w13).dtype).removeprefix(
                    "torch."
                ),
                "router_logits": self.observations.get("router_logits_dtype"),
                "topk_weights": "float32",
                "topk_ids": str(self.topk_dtype).removeprefix("torch."),
            },
            "boundaries": {
                "gate_routing": "the layer's gate projection + router.select_experts",
                EXPERTS: "moe_kernel.apply (native prepare, experts, finalize and output "
                "allocation) with cloned banks; reference: routed_experts.forward_modular",
                WRAPPER: "parent forward minus the gate/router and routed-kernel scopes "
                "(scopes elided; ownership verified on traced native forwards)"
                + (
                    ""
                    if WRAPPER in self.components
                    else "; launches no device activity in this layer (launch_ownership), "
                    "so it has no table row"
                ),
            },
            "launch_ownership": self.ownership,
            "state_checks": "parameter bindings, layouts and version counters; effective MoE "
            "config; callable identities; at build and before every reference comparison",
            "capabilities": {
                "deferred_finalization": self.deferral_readings,
                "admission": "live API probes and the engine layer's state; no version checks",
            },
            "excluded": ["collectives", "cpu_time", "launch_gaps"],
            "attribution": (
                "launch_correlation: CUDA kernels, copies and sets attributed by the "
                "correlation id of their host launch inside each component's range"
            ),
        }

    def local_forward(self, component: str, rows: int) -> Any:
        if component == "gate_routing":
            return _GateRouting(self, rows)
        if component == WRAPPER:
            return _Wrapper(self, rows)
        raise ValueError(f"vllm-live has no local component {component!r}")

    def prepare_experts(self, stimulus: RoutingStimulus) -> _Prepared:
        torch = self._torch
        n = stimulus.tokens
        return _Prepared(
            hidden=self.random((n, self.hidden), seed=n + 11),
            topk_ids=torch.from_numpy(stimulus.topk_ids).to(self.device, self.topk_dtype),
            topk_weights=torch.from_numpy(stimulus.topk_weights).to(self.device),
        )

    def run_experts(self, prepared: _Prepared, bank: int) -> Any:
        w13, w2 = self.banks[bank]
        return self._kernel_apply(prepared, w13, w2)

    def reference_experts(self, prepared: _Prepared) -> Any:
        self.check_state()
        return self.layer.routed_experts.forward_modular(
            x=prepared.hidden,
            topk_weights=prepared.topk_weights,
            topk_ids=prepared.topk_ids,
            shared_experts=None,
            shared_experts_input=None,
        )

    def close(self) -> None:
        self.banks = []
        engine, self._engine = self._engine, None
        shutdown = getattr(getattr(engine, "llm_engine", None), "engine_core", None)
        with contextlib.suppress(Exception):
            if shutdown is not None and hasattr(shutdown, "shutdown"):
                shutdown.shutdown()
        del engine
        gc.collect()
        if self.device.type == "cuda":
            self._torch.cuda.empty_cache()
