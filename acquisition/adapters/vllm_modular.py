"""vLLM's own modular MoE kernel for one target rank: the ``vllm-modular`` adapter (R21-R24).

One physical GPU emulates one rank of a TP x DP (full EP) deployment. The adapter asks vLLM
for everything a rank would get from its engine: the expert map of the rank
(``determine_expert_map``, linear placement), the native unquantized expert backend for the
rank's parallel configuration (``select_unquantized_moe_backend``, resolved per target, so it
may differ between DP1 and DP+EP), the prepare/finalize object the engine would pair with it,
the weight layout conversion of that backend, the gate projection
(``UnquantizedLinearMethod.apply``: what ``ReplicatedLinear.forward`` runs; the module itself
needs an initialised TP group) and the router (``create_fused_moe_router``). Expert weights are synthetic, in the native layout; the
checkpoint's global expert count and top-k are kept.

Components and their boundaries:

- ``gate_routing`` (local rows): the gate projection and the router's ``select_experts``.
- ``experts`` (gathered rows): what the modular kernel runs between dispatch and combine:
  DP1 runs the native ``prepare`` (admitted only as an input-preserving no-op), the experts'
  ``apply`` writing into the caller's output buffer, and the native ``finalize`` with the
  experts' no-op reduction on that same buffer, so no copy is needed. DP+EP runs the experts'
  ``apply`` and its reduction on the gathered rows; the all-gather dispatch and the
  reduce-scatter combine are collectives, charged by the network model, not here.
- ``finalize_copy`` (local rows, DP+EP only): the native finalize's copy of the combined rows
  into the layer output.

Before recording DP1's ``local_execution`` the session verifies, outside any timing, that
``prepare`` returned the very input tensor with no scales, no expert-token metadata and no
dispatched ids or weights, that ``finalize`` received the caller's buffer as the experts'
output, and that both launch no device activity at all. A backend that needs more work
(quantizing prepare, a copying or weighting reduction, a monolithic or batched kernel, another
all-to-all backend) is declined with the reason, never timed as something else.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from acquisition.adapters.base import Admission, GateRoutingForward, RuntimeInfo
from acquisition.adapters.vllm_capabilities import (
    MODULAR_PARAMETERS,
    MODULAR_SYMBOLS,
    ApiSurface,
    CapabilityError,
    Resolver,
    check_parameters,
    deferral_reasons,
    import_resolver,
    model_reasons,
    probe_surface,
    qualified_name,
)
from moetables.bundle import EXPERTS
from moetables.geometry import ExpertGeometry, MoeTarget, linear_expert_map

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from acquisition.catalog import MoeModel
    from acquisition.protocol.stimulus import RoutingStimulus

__all__ = ["NativeChoice", "VllmModularBackend", "VllmModularSession", "resolve_native"]

_SEED = 20261129
NO_DP_EP = "no_dp_ep"
NAIVE_DP_EP = "naive_dp_ep"
# Tokens of the build-time probes (alias, zero-activity and native-apply observations).
_PROBE_TOKENS = 32


def _torch_dtype(name: str) -> Any:
    import torch

    return {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}[name]


@dataclass(frozen=True, slots=True)
class NativeChoice:
    """What vLLM resolves for one target rank, before any tensor is allocated."""

    parallel: Any
    moe_config: Any
    backend: Any
    experts_cls: type
    prepare_kind: str
    router: Any
    activation: Any
    local_experts: int
    expert_map: tuple[int, ...]
    all2all_backend: str

    @property
    def backend_label(self) -> str:
        return str(getattr(self.backend, "value", self.backend))


def _parallel_config(surface: ApiSurface, target: MoeTarget, all2all_backend: str) -> Any:
    """The rank's FusedMoEParallelConfig, as vLLM's ``make`` derives it for full EP.

    ``make`` reads the rank from initialised process groups, which a single-GPU emulation
    does not have; the fields are filled exactly as its EP branch does (tp folded into ep).
    """
    cls = surface["parallel_config"]
    values = {
        "tp_size": 1 if target.ep > 1 else target.tp,
        "tp_rank": 0,
        "pcp_size": 1,
        "pcp_rank": 0,
        "dp_size": target.dp,
        "dp_rank": target.dp_rank,
        "ep_size": target.ep,
        "ep_rank": target.rank,
        "sp_size": target.tp if target.sequence_parallel else 1,
        "use_ep": target.ep > 1,
        "all2all_backend": all2all_backend,
        "enable_eplb": False,
    }
    if dataclasses.is_dataclass(cls):
        names = {f.name for f in dataclasses.fields(cls)}
        absent = sorted(names - values.keys())
        if absent:
            raise CapabilityError(
                f"unsupported API: {qualified_name(cls)} has fields {absent} this adapter "
                "does not know how to fill"
            )
        values = {k: v for k, v in values.items() if k in names}
    return cls(**values)


def resolve_native(
    surface: ApiSurface,
    model: MoeModel,
    target: MoeTarget,
    *,
    device: Any,
    dtype: Any,
    all2all_backend: str,
) -> NativeChoice:
    """Ask vLLM what one rank of ``target`` runs; CapabilityError says why it cannot be."""
    try:
        activation = surface["activation"].from_str(model.activation)
    except (ValueError, KeyError) as exc:
        raise CapabilityError(f"activation {model.activation!r}: {exc}") from None
    if not getattr(activation, "is_gated", True):
        raise CapabilityError(
            f"activation {model.activation!r} is not gated: the standard act-and-mul layout "
            "is the only admitted one"
        )
    parallel = _parallel_config(surface, target, all2all_backend)
    local, mapping, *_ = surface["expert_map"](target.ep, target.rank, model.global_experts)
    if mapping is None:
        expert_map = tuple(range(model.global_experts))
    else:
        expert_map = tuple(int(v) for v in mapping.tolist())
    expected = tuple(linear_expert_map(model.global_experts, target.ep, target.rank))
    if int(local) != sum(1 for e in expected if e >= 0) or expert_map != expected:
        raise CapabilityError(
            f"vLLM's expert map for EP rank {target.rank}/{target.ep} is not the linear "
            "placement the plan and the lookup assume"
        )
    router = surface["router_factory"](
        top_k=model.top_k,
        global_num_experts=model.global_experts,
        renormalize=model.renormalize,
        scoring_func=model.scoring,
    )
    if not callable(getattr(router, "select_experts", None)):
        raise CapabilityError(
            f"unsupported API: router {qualified_name(router)} has no select_experts"
        )
    moe_config = surface["moe_config"](
        num_experts=model.global_experts,
        experts_per_token=model.top_k,
        hidden_dim=model.hidden_size,
        intermediate_size=model.expert_intermediate_size,
        num_local_experts=int(local),
        num_logical_experts=model.global_experts,
        activation=activation,
        device=device,
        routing_method=router.routing_method_type,
        moe_parallel_config=parallel,
        in_dtype=dtype,
    )
    try:
        backend, experts_cls = surface["select_backend"](moe_config)
    except (ValueError, NotImplementedError) as exc:
        raise CapabilityError(f"vLLM selects no unquantized MoE backend here: {exc}") from None
    if experts_cls is None:
        raise CapabilityError(
            f"backend {getattr(backend, 'value', backend)} has no modular kernel class"
        )
    if not (isinstance(experts_cls, type) and issubclass(experts_cls, surface["modular_experts"])):
        raise CapabilityError(
            f"native experts {qualified_name(experts_cls)} are not modular experts "
            "(a monolithic kernel routes internally; no routing stimulus can be replayed)"
        )
    standard = surface["activation_format"].Standard
    if experts_cls.activation_format() != standard:
        raise CapabilityError(
            f"native experts {qualified_name(experts_cls)} use the "
            f"{experts_cls.activation_format()} activation layout, not the standard one"
        )
    if not parallel.use_all2all_kernels:
        prepare_kind = NO_DP_EP
    elif parallel.use_ag_rs_all2all_kernels:
        prepare_kind = NAIVE_DP_EP
    else:
        raise CapabilityError(
            f"all-to-all backend {all2all_backend!r}: only the all-gather/reduce-scatter "
            "prepare/finalize is emulated on one GPU"
        )
    return NativeChoice(
        parallel=parallel,
        moe_config=moe_config,
        backend=backend,
        experts_cls=experts_cls,
        prepare_kind=prepare_kind,
        router=router,
        activation=activation,
        local_experts=int(local),
        expert_map=expert_map,
        all2all_backend=all2all_backend,
    )


@contextlib.contextmanager
def _vllm_context(surface: ApiSurface) -> Iterator[Any]:
    """A default VllmConfig made current, as vLLM's own kernel tests run modules."""
    config = surface["vllm_config"]()
    with surface["set_vllm_config"](config):
        yield config


def _class_reasons(surface: ApiSurface) -> list[str]:
    """Checks on classes, before anything is built: deferral attributes, base interfaces."""
    reasons, _ = deferral_reasons(
        {
            "FusedMoEKernel": surface["kernel"],
            "FusedMoEPrepareAndFinalizeModular": surface["modular_prepare_finalize"],
            "FusedMoEExpertsModular": surface["modular_experts"],
        }
    )
    reasons += check_parameters(
        "FusedMoEExpertsModular.apply",
        surface["modular_experts"].apply,
        MODULAR_PARAMETERS["experts.apply"],
    )
    reasons += check_parameters(
        "FusedMoEPrepareAndFinalizeModular.prepare",
        surface["modular_prepare_finalize"].prepare,
        MODULAR_PARAMETERS["prepare_finalize.prepare"],
    )
    reasons += check_parameters(
        "FusedMoEPrepareAndFinalizeModular.finalize",
        surface["modular_prepare_finalize"].finalize,
        MODULAR_PARAMETERS["prepare_finalize.finalize"],
    )
    return reasons


class VllmModularBackend:
    """Admits unquantized modular expert execution of any full-EP target rank."""

    name: ClassVar[str] = "vllm-modular"
    native: ClassVar[bool] = True

    def __init__(
        self,
        resolve: Resolver = import_resolver,
        activities: Callable[[Callable[[], Any]], list[str]] | None = None,
    ) -> None:
        self._resolve = resolve
        self._activities = activities

    def components(self, model: MoeModel, target: MoeTarget) -> tuple[str, ...]:
        """DP+EP adds the local finalize copy; DP1's finalize is a verified no-op (R22, R23)."""
        if target.dp > 1:
            return ("gate_routing", EXPERTS, "finalize_copy")
        return ("gate_routing", EXPERTS)

    def surface(self) -> ApiSurface:
        return probe_surface(MODULAR_SYMBOLS, self._resolve)

    def admit(self, model: MoeModel, target: MoeTarget, runtime: RuntimeInfo) -> Admission:
        reasons: list[str] = []
        if runtime.device != "cuda" or not runtime.accelerator_available:
            reasons.append(
                "needs a CUDA device: vLLM's modular experts are GPU kernels "
                f"(--device {runtime.device}, accelerator available: "
                f"{runtime.accelerator_available})"
            )
        reasons += model_reasons(model, quantized_allowed=False)
        if model.shared_experts:
            reasons.append(
                "shared experts: the modular boundaries hold routed experts only; use the live "
                "adapter, whose wrapper keeps the shared experts"
            )
        try:
            self._resolve("vllm")
            surface = self.surface()
        except Exception as exc:  # vLLM failing at import is a decline, not a crash
            reasons.append(f"vLLM is not importable here: {type(exc).__name__}: {exc}")
            return Admission.decline(self.name, *reasons)
        if not surface.complete:
            return Admission.decline(self.name, *reasons, *surface.missing)
        reasons += _class_reasons(surface)
        if reasons:
            return Admission.decline(self.name, *reasons)
        try:
            import torch

            with _vllm_context(surface) as config:
                resolve_native(
                    surface,
                    model,
                    target,
                    device=torch.device("cuda"),
                    dtype=_torch_dtype(model.dtype or "bfloat16"),
                    all2all_backend=config.parallel_config.all2all_backend,
                )
        except CapabilityError as exc:
            return Admission.decline(self.name, *exc.reasons)
        return Admission.accept(self.name)

    def build(
        self, model: MoeModel, target: MoeTarget, runtime: RuntimeInfo, dtype: str
    ) -> VllmModularSession:
        return VllmModularSession(
            model, target, runtime, dtype, self.surface(), activities=self._activities
        )


@dataclass(slots=True)
class _Prepared:
    hidden: Any
    topk_ids: Any
    topk_weights: Any
    output: Any
    reference_output: Any


class _Gate:
    """The gate projection: vLLM's UnquantizedLinearMethod.apply on the gate weight."""

    def __init__(self, method: Any, weight: Any) -> None:
        self.method = method
        self.weight = weight

    def __call__(self, x: Any) -> Any:
        return self.method.apply(self, x, None)


class _FinalizeCopy:
    """The native finalize's copy of this rank's combined rows into the layer output."""

    def __init__(self, session: VllmModularSession, rows: int) -> None:
        import torch

        self._combined = session.random((rows, session.hidden), seed=rows + 7)
        self._output = torch.empty_like(self._combined)

    def run(self) -> Any:
        self._output.copy_(self._combined)
        return self._output

    def reference(self) -> Any:
        return self._combined.clone()


def clone_banks(tensors: tuple[Any, ...], count: int) -> list[tuple[Any, ...]]:
    """``count`` independent copies of ``tensors``, keeping aliases, offsets and strides (R33).

    Tensors sharing one storage share one cloned storage in each bank, viewed at the same
    offsets with the same sizes and strides.
    """
    import torch

    banks: list[tuple[Any, ...]] = []
    for _ in range(count):
        storages: dict[int, Any] = {}
        bank = []
        for t in tensors:
            storage = t.untyped_storage()
            key = storage.data_ptr()
            if key not in storages:
                storages[key] = storage.clone()
            view = torch.empty(0, dtype=t.dtype, device=t.device)
            view.set_(storages[key], t.storage_offset(), t.size(), t.stride())
            bank.append(view)
        banks.append(tuple(bank))
    return banks


def unique_storage_bytes(tensors: tuple[Any, ...]) -> int:
    seen: dict[int, int] = {}
    for t in tensors:
        storage = t.untyped_storage()
        seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())


class UnquantizedExpertBanks:
    """Bank handling of sessions whose local experts are two unquantized tensors, w13 and w2.

    Such experts own no scales or other native per-weight state, so a conditioned clone owns
    exactly the weights (R33); clones keep aliases, offsets and strides (``clone_banks``).
    """

    w13: Any
    w2: Any
    device: Any
    _torch: Any
    banks: list[tuple[Any, Any]]

    def expert_weight_bytes(self) -> int:
        return unique_storage_bytes((self.w13, self.w2))

    def expert_bank_bytes(self) -> int:
        return self.expert_weight_bytes()

    def allocate_banks(self, count: int) -> None:
        self.banks = [(b[0], b[1]) for b in clone_banks((self.w13, self.w2), count)]

    def synchronize(self) -> None:
        if self.device.type == "cuda":
            self._torch.cuda.synchronize()


class VllmModularSession(UnquantizedExpertBanks):
    """vLLM's modular kernel, gate and router for one target rank, with synthetic weights."""

    def __init__(
        self,
        model: MoeModel,
        target: MoeTarget,
        runtime: RuntimeInfo,
        dtype: str,
        surface: ApiSurface,
        *,
        activities: Callable[[Callable[[], Any]], list[str]] | None = None,
    ) -> None:
        import torch

        if not surface.complete:
            raise CapabilityError(*surface.missing)
        self._torch = torch
        self.model = model
        self.target = target
        self.surface = surface
        self.dtype_name = dtype
        self.dtype = _torch_dtype(dtype)
        # CUDA on the GPU host; a CPU session exists for tests with fakes of vLLM's objects.
        self.device = (
            torch.device("cuda", torch.cuda.current_device())
            if runtime.device == "cuda"
            else torch.device("cpu")
        )
        self.hidden = model.hidden_size
        self.top_k = model.top_k
        self.global_experts = model.global_experts
        self.components: tuple[str, ...] = (
            ("gate_routing", EXPERTS, "finalize_copy")
            if target.dp > 1
            else ("gate_routing", EXPERTS)
        )
        self._stack = contextlib.ExitStack()
        self.banks: list[tuple[Any, Any]] = []
        if activities is None:
            from acquisition.adapters.vllm_ownership import launched_activity_names

            activities = launched_activity_names
        self._activities = activities
        try:
            self._build(surface, runtime)
        except BaseException:
            self._stack.close()
            raise

    # -- construction -------------------------------------------------------------------

    def _build(self, surface: ApiSurface, runtime: RuntimeInfo) -> None:
        torch = self._torch
        config = self._stack.enter_context(_vllm_context(surface))
        if not surface["workspace_ready"]():
            surface["workspace_init"](self.device)
        choice = resolve_native(
            surface,
            self.model,
            self.target,
            device=self.device,
            dtype=self.dtype,
            all2all_backend=config.parallel_config.all2all_backend,
        )
        self.choice = choice
        self.local_experts = choice.local_experts
        if choice.prepare_kind == NO_DP_EP:
            prepare_finalize = surface["no_dp_ep"](use_monolithic=False)
        else:
            prepare_finalize = surface["naive_dp_ep"](
                use_monolithic=False,
                is_sequence_parallel=choice.parallel.is_sequence_parallel,
                num_dispatchers=self.target.ep,
            )
        if not isinstance(prepare_finalize, surface["modular_prepare_finalize"]):
            raise CapabilityError(
                f"prepare/finalize {qualified_name(prepare_finalize)} is not modular"
            )
        self.quant_config = surface["unquantized"]
        experts = choice.experts_cls(moe_config=choice.moe_config, quant_config=self.quant_config)
        kernel = surface["kernel"](prepare_finalize, experts)
        if getattr(kernel, "is_monolithic", False):
            raise CapabilityError(f"kernel {qualified_name(kernel)} is monolithic")
        self.prepare_finalize = prepare_finalize
        self.experts = experts
        self.kernel = kernel
        self.reduction = experts.finalize_weight_and_reduce_impl()
        reasons = []
        reasons += check_parameters(
            f"{qualified_name(experts)}.apply", experts.apply, MODULAR_PARAMETERS["experts.apply"]
        )
        reasons += check_parameters(
            f"{qualified_name(prepare_finalize)}.prepare",
            prepare_finalize.prepare,
            MODULAR_PARAMETERS["prepare_finalize.prepare"],
        )
        reasons += check_parameters(
            f"{qualified_name(prepare_finalize)}.finalize",
            prepare_finalize.finalize,
            MODULAR_PARAMETERS["prepare_finalize.finalize"],
        )
        reasons += check_parameters(
            f"{qualified_name(self.reduction)}.apply",
            self.reduction.apply,
            MODULAR_PARAMETERS["reduction.apply"],
        )
        if not callable(getattr(getattr(kernel, "impl", None), "_allocate_buffers", None)):
            reasons.append(
                f"unsupported API: {qualified_name(kernel)}.impl has no _allocate_buffers "
                "(the native workspace allocation)"
            )
        if not isinstance(self.reduction, surface["noop_reduction"]):
            reasons.append(
                f"the experts' reduction is {qualified_name(self.reduction)}, not the no-op "
                "reduction: finalization would need weighting or a copy outside the audited "
                "boundaries"
            )
        if getattr(experts, "expects_unquantized_inputs", False):
            reasons.append("the experts defer input quantization: prepare is not a no-op")
        deferral, self.deferral_readings = deferral_reasons(
            {
                "kernel": kernel,
                "kernel.impl": getattr(kernel, "impl", None),
                "prepare_finalize": prepare_finalize,
                "experts": experts,
                "moe_config": choice.moe_config,
            }
        )
        reasons += deferral
        if reasons:
            raise CapabilityError(*reasons)

        # Weights: synthetic values in the backend's native layout.
        width = self.model.expert_intermediate_size
        h_scale = self.hidden**-0.5
        w13 = self.random((self.local_experts, 2 * width, self.hidden), seed=2, scale=h_scale)
        w2 = self.random((self.local_experts, self.hidden, width), seed=3, scale=width**-0.5)
        self.w13, self.w2 = surface["kernel_format"](choice.backend, choice.moe_config, w13, w2)
        self.expert_map = (
            torch.tensor(choice.expert_map, dtype=torch.int32, device=self.device)
            if self.target.ep > 1
            else None
        )
        # The gate as vLLM's unquantized linear method applies it (ReplicatedLinear's own
        # parameters need an initialised TP group, which one emulated rank does not have).
        gate = _Gate(
            surface["linear_method"](),
            self.random((self.global_experts, self.hidden), seed=1, scale=h_scale),
        )
        self.gate = gate
        self.router = choice.router
        self.topk_dtype = prepare_finalize.topk_indices_dtype() or torch.int32
        self.observations: dict[str, Any] = {}
        started = time.perf_counter()
        self._observe(runtime)
        # Seconds of the build's own traces, for the acquisition's phase table (issue 19).
        self.build_phases = {"build.observations": time.perf_counter() - started}

    def _probe_stimulus(self) -> RoutingStimulus:
        from acquisition.protocol.stimulus import routing_stimulus

        geometry = ExpertGeometry.for_target(self.global_experts, self.top_k, self.target)
        n = _PROBE_TOKENS
        a = min(self.local_experts, n)
        m = n * min(self.top_k, a)
        return routing_stimulus(geometry, list(self.choice.expert_map), n, a, m, seed=n)

    def _observe(self, runtime: RuntimeInfo) -> None:
        """Build-time evidence: DP1 no-op checks, gate dtype, and the native apply's extra work."""
        prepared = self.prepare_experts(self._probe_stimulus())
        logits = self.gate(prepared.hidden)
        self.observations["router_logits_dtype"] = str(logits.dtype).removeprefix("torch.")
        if self.choice.prepare_kind == NO_DP_EP:
            self._check_local_execution(prepared)
        pieces = Counter(
            self._activities(lambda: self._experts(prepared, self.w13, self.w2, prepared.output))
        )
        self.observations["experts_activities_per_forward"] = dict(pieces)
        if self.choice.prepare_kind != NO_DP_EP:
            # DP+EP: FusedMoEKernel.apply would run the all-gather and reduce-scatter
            # collectives, which are never executed on one GPU.
            return
        native = Counter(self._activities(lambda: self._native_apply(prepared)))
        self.observations["native_kernel_apply_comparison"] = {
            "tokens": prepared.hidden.shape[0],
            "activities_only_in_FusedMoEKernel.apply": dict(native - pieces),
            "activities_missing_from_FusedMoEKernel.apply": dict(pieces - native),
            "note": (
                "FusedMoEKernel.apply allocates its own output; where vLLM leaves the expert "
                "output in its workspace, its no-op reduction copies it (listed above). The "
                "experts boundary writes into the caller's buffer instead, so that copy is not "
                "part of this table (R22)."
            ),
        }

    def _native_apply(self, prepared: _Prepared) -> Any:
        return self.kernel.apply(
            hidden_states=prepared.hidden,
            w1=self.w13,
            w2=self.w2,
            topk_weights=prepared.topk_weights,
            topk_ids=prepared.topk_ids,
            activation=self.choice.activation,
            global_num_experts=self.global_experts,
            expert_map=self.expert_map,
            apply_router_weight_on_input=False,
        )

    def _check_local_execution(self, prepared: _Prepared) -> None:
        """R22: prepare preserves the input, finalize needs no copy, neither launches work."""
        result: dict[str, Any] = {}

        def prepare() -> None:
            result["prepared"] = self._prepare(prepared)

        def finalize() -> None:
            self.prepare_finalize.finalize(
                prepared.output,
                prepared.output,
                prepared.topk_weights,
                prepared.topk_ids,
                False,
                self.reduction,
            )

        prepare_activities = self._activities(prepare)
        finalize_activities = self._activities(finalize)
        reasons = self._alias_reasons(prepared, result["prepared"])
        if prepare_activities:
            reasons.append(
                f"native prepare launches {len(prepare_activities)} device activities "
                f"({', '.join(sorted(set(prepare_activities)))}): not a no-op"
            )
        if finalize_activities:
            reasons.append(
                f"native finalize launches {len(finalize_activities)} device activities "
                f"({', '.join(sorted(set(finalize_activities)))}) on the caller's buffer"
            )
        if reasons:
            raise CapabilityError(*reasons)
        self.observations["local_execution"] = {
            "prepare": "returns the input tensor itself; no scales, no expert-token metadata, "
            "no dispatched ids or weights; 0 device activities",
            "finalize": f"{qualified_name(self.reduction)} on the caller's buffer "
            "(output is the experts' output): 0 device activities",
            "checked_tokens": prepared.hidden.shape[0],
        }

    def _check_alias(self, prepared: _Prepared, result: tuple[Any, ...]) -> None:
        reasons = self._alias_reasons(prepared, result)
        if reasons:
            raise CapabilityError(*reasons)

    @staticmethod
    def _alias_reasons(prepared: _Prepared, result: tuple[Any, ...]) -> list[str]:
        a1q, scale, meta, ids, weights = result
        reasons = []
        if a1q is not prepared.hidden:
            reasons.append(
                "native prepare returned a new tensor instead of the input (alias identity lost)"
            )
        if scale is not None:
            reasons.append("native prepare produced activation scales")
        if meta is not None:
            reasons.append("native prepare produced expert-token metadata")
        if ids is not None or weights is not None:
            reasons.append("native prepare dispatched top-k ids or weights")
        return reasons

    # -- helpers --------------------------------------------------------------------------

    def random(self, shape: tuple[int, ...], *, seed: int, scale: float = 1.0) -> Any:
        torch = self._torch
        generator = torch.Generator(device=self.device).manual_seed(_SEED + seed)
        values = torch.randn(shape, generator=generator, device=self.device, dtype=torch.float32)
        return (values * scale).to(self.dtype)

    def _prepare(self, prepared: _Prepared) -> tuple[Any, ...]:
        return tuple(
            self.prepare_finalize.prepare(
                prepared.hidden,
                prepared.topk_weights,
                prepared.topk_ids,
                self.global_experts,
                self.expert_map,
                False,
                self.quant_config,
                defer_input_quant=False,
            )
        )

    def _experts(self, prepared: _Prepared, w13: Any, w2: Any, output: Any) -> Any:
        """One experts forward into ``output`` (the caller's buffer)."""
        topk_weights, topk_ids = prepared.topk_weights, prepared.topk_ids
        if self.choice.prepare_kind == NO_DP_EP:
            a1q, a1q_scale, meta, _ids, _weights = self._prepare(prepared)
        else:
            # DP+EP: these rows are what the all-gather delivered (unquantized: no scales).
            a1q, a1q_scale, meta = prepared.hidden, None, None
        _, tokens, n, k, top_k = self.experts.moe_problem_size(a1q, w13, w2, topk_ids)
        workspace13, workspace2, _ = self.kernel.impl._allocate_buffers(
            self.dtype,
            a1q.device,
            tokens,
            tokens,
            n,
            k,
            top_k,
            self.global_experts,
            self.local_experts,
            meta,
            self.choice.activation,
        )
        self.experts.apply(
            output=output,
            hidden_states=a1q,
            w1=w13,
            w2=w2,
            topk_weights=topk_weights,
            topk_ids=topk_ids,
            activation=self.choice.activation,
            global_num_experts=self.global_experts,
            expert_map=self.expert_map,
            a1q_scale=a1q_scale,
            a2_scale=self.experts.a2_scale,
            workspace13=workspace13,
            workspace2=workspace2,
            expert_tokens_meta=meta,
            apply_router_weight_on_input=False,
        )
        if self.choice.prepare_kind == NO_DP_EP:
            self.prepare_finalize.finalize(
                output, output, topk_weights, topk_ids, False, self.reduction
            )
        else:
            reduced = self.reduction.apply(
                output=None,
                fused_expert_output=output,
                topk_weights=topk_weights,
                topk_ids=topk_ids,
                apply_router_weight_on_input=False,
            )
            if reduced is not output:
                raise CapabilityError(
                    "the no-op reduction returned a new tensor on the gathered rows"
                )
        return output

    def gate_routing(self, hidden: Any) -> tuple[Any, Any]:
        logits = self.gate(hidden)
        return tuple(
            self.router.select_experts(
                hidden_states=hidden, router_logits=logits, topk_indices_dtype=self.topk_dtype
            )
        )

    # -- the ComponentSession interface ---------------------------------------------------

    def describe(self) -> dict[str, Any]:
        torch = self._torch
        try:
            import vllm

            vllm_version = str(vllm.__version__)
        except Exception:  # recorded only; never decides anything
            vllm_version = None
        choice = self.choice
        boundaries = {
            "gate_routing": (
                "gate projection (vLLM UnquantizedLinearMethod.apply, the method "
                "ReplicatedLinear.forward calls) + router.select_experts"
            ),
            EXPERTS: (
                "native prepare (verified input-preserving no-op) + experts.apply into the "
                "caller's buffer + native finalize with the no-op reduction (no copy)"
                if choice.prepare_kind == NO_DP_EP
                else "experts.apply on the gathered rows into the caller's buffer + the "
                "experts' no-op reduction; dispatch (all-gather) and combine (reduce-scatter) "
                "are collectives and excluded"
            ),
        }
        if "finalize_copy" in self.components:
            boundaries["finalize_copy"] = (
                "the native finalize's copy of the combined local rows into the layer output"
            )
        return {
            "name": VllmModularBackend.name,
            "native": True,
            "implementation": f"{__name__}.VllmModularSession",
            "vllm_version": vllm_version,
            "kernel_class": qualified_name(self.kernel),
            "expert_class": qualified_name(self.experts),
            "prepare_finalize_class": qualified_name(self.prepare_finalize),
            "reduction_class": qualified_name(self.reduction),
            "native_backend": choice.backend_label,
            "backend_resolution": "select_unquantized_moe_backend(FusedMoEConfig of this rank)",
            "prepare_finalize_kind": choice.prepare_kind,
            "all2all_backend": choice.all2all_backend,
            "router_class": qualified_name(self.router),
            "gate_class": qualified_name(self.gate),
            "expert_map_source": "vllm determine_expert_map (linear placement)",
            "moe_parallel_config": {
                k: getattr(choice.parallel, k)
                for k in ("tp_size", "dp_size", "ep_size", "ep_rank", "dp_rank", "sp_size")
                if hasattr(choice.parallel, k)
            },
            "expert_layout": {
                "w13": {"shape": list(self.w13.shape), "stride": list(self.w13.stride())},
                "w2": {"shape": list(self.w2.shape), "stride": list(self.w2.stride())},
                "conversion": "convert_to_unquantized_kernel_format(backend)",
            },
            "activation": str(getattr(choice.activation, "value", choice.activation)),
            "activation_layout": "standard",
            "routing": {
                "scoring": self.model.scoring,
                "renormalize": self.model.renormalize,
                "routing_method": str(getattr(self.router, "routing_method_type", None)),
            },
            "dtypes": {
                "hidden_states": self.dtype_name,
                "expert_weights": str(self.w13.dtype).removeprefix("torch."),
                "gate_weight": str(self.gate.weight.dtype).removeprefix("torch."),
                "router_logits": self.observations.get("router_logits_dtype"),
                "topk_weights": "float32",
                "topk_ids": str(self.topk_dtype).removeprefix("torch."),
            },
            "gate_weight_bytes": self.gate.weight.numel() * self.gate.weight.element_size(),
            "boundaries": boundaries,
            "local_execution": self.observations.get("local_execution"),
            "experts_activities_per_forward": self.observations.get(
                "experts_activities_per_forward"
            ),
            "native_kernel_apply_comparison": self.observations.get(
                "native_kernel_apply_comparison"
            ),
            "capabilities": {
                "deferred_finalization": self.deferral_readings,
                "admission": "live API probes (imports, signatures, classes); no version checks",
            },
            "synthetic_weights": "seeded normal values in the native layout",
            "excluded": ["collectives", "cpu_time", "launch_gaps", "shared_experts"],
            "attribution": (
                "launch_correlation: CUDA kernels, copies and sets attributed by the "
                "correlation id of their host launch inside each component's range"
            ),
            "device_capability": (
                list(torch.cuda.get_device_capability(self.device))
                if self.device.type == "cuda"
                else None
            ),
        }

    def local_forward(self, component: str, rows: int) -> Any:
        if component == "gate_routing":
            return GateRoutingForward(self, rows)
        if component == "finalize_copy" and "finalize_copy" in self.components:
            return _FinalizeCopy(self, rows)
        raise ValueError(f"vllm-modular has no local component {component!r} for this target")

    def prepare_experts(self, stimulus: RoutingStimulus) -> _Prepared:
        torch = self._torch
        n = stimulus.tokens
        hidden = self.random((n, self.hidden), seed=n + 11)
        return _Prepared(
            hidden=hidden,
            topk_ids=torch.from_numpy(stimulus.topk_ids).to(self.device, self.topk_dtype),
            topk_weights=torch.from_numpy(stimulus.topk_weights).to(self.device),
            output=torch.empty_like(hidden),
            reference_output=torch.empty_like(hidden),
        )

    def run_experts(self, prepared: _Prepared, bank: int) -> Any:
        w13, w2 = self.banks[bank]
        return self._experts(prepared, w13, w2, prepared.output)

    def reference_experts(self, prepared: _Prepared) -> Any:
        if self.choice.prepare_kind == NO_DP_EP:
            self._check_alias(prepared, self._prepare(prepared))
        return self._experts(prepared, self.w13, self.w2, prepared.reference_output)

    def close(self) -> None:
        self.banks = []
        self._stack.close()
        if self.device.type == "cuda":
            self._torch.cuda.empty_cache()
