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

Block-wise FP8 checkpoints (``quant_method: fp8`` with a ``weight_block_size``) take the experts
vLLM's FP8 oracle selects for the rank (``vllm_fp8.select_fp8``: the call ``Fp8MoEMethod``
makes), with FP8 weights and float32 block scales converted for that backend and the kernel's
own ``FusedMoEQuantConfig``. Their native prepare quantizes the activations (dynamic, per token
and 128-column group), so the boundaries move with it:

- DP1: ``experts`` holds the quantizing prepare; it is verified to return a new FP8 tensor of
  the input's shape and per-group float32 scales, and nothing else (no metadata, no dispatched
  ids or weights); finalize must still be a no-op on the caller's buffer;
- DP+EP: ``dispatch_quant`` (local rows) is the prepare's quantization of this rank's rows
  before the all-gather (``naive_dp_ep._quantize_and_setup_dispatch``, the native function);
  ``experts`` receives the gathered FP8 rows and scales, as the all-gather delivers them.

Each weight bank owns its FP8 weights and their scales, and its own experts object whose
quant config points at the bank's scales (the scales live in the quant config, not in
``apply``'s arguments).
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from acquisition.adapters.base import GateRoutingForward, RuntimeInfo
from acquisition.adapters.vllm_capabilities import (
    ApiSurface,
    CapabilityError,
    Resolver,
    qualified_name,
)
from moetables.bundle import EXPERTS
from moetables.geometry import MoeTarget

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Sequence

    from acquisition.adapters.triton_precompile import PrecompileReport
    from acquisition.catalog import MoeModel
    from acquisition.protocol.attribution import ProfiledWindow
    from acquisition.protocol.stimulus import RoutingStimulus
from acquisition.adapters.vllm_banks import ScaledExpertBanks
from acquisition.adapters.vllm_descriptions import describe_modular
from acquisition.adapters.vllm_fp8 import DISPATCH_QUANT, fp8_quant_config, fp8_weights
from acquisition.adapters.vllm_modular_checks import ModularObservations
from acquisition.adapters.vllm_modular_forward import trace_tokens, traced_forward
from acquisition.adapters.vllm_modular_native import (
    NAIVE_DP_EP,
    NO_DP_EP,
    kernel_reasons,
    resolve_native,
    torch_dtype,
    vllm_context,
)

__all__ = ["NAIVE_DP_EP", "NO_DP_EP", "VllmModularSession"]

_SEED = 20261129
# Local rows traced for conservation when the runtime carries no serving limits.
_PROBE_ROWS = 32


@dataclass(slots=True)
class _HeldViews:
    """The workspace views of one context's forwards (``hold_workspace``)."""

    key: Any = None
    views: tuple[Any, Any] = (None, None)
    requested: int = 0
    reused: int = 0


@dataclass(slots=True)
class _Prepared:
    hidden: Any
    topk_ids: Any
    topk_weights: Any
    output: Any
    reference_output: Any
    # DP+EP with quantized activations: the gathered FP8 rows and their scales, as the
    # all-gather delivers them (per-row quantization: the gather of quantized local rows).
    dispatched: Any = None
    dispatched_scale: Any = None


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


class _DispatchQuant:
    """The native prepare's quantization of this rank's local rows before the all-gather."""

    def __init__(self, session: VllmModularSession, rows: int) -> None:
        self._session = session
        self._hidden = session.random((rows, session.hidden), seed=rows + 5)

    def run(self) -> Any:
        return self._session.dispatch_quantize(self._hidden)

    def reference(self) -> Any:
        return self._session.dispatch_quantize(self._hidden.clone())


def modular_components(model: MoeModel, target: MoeTarget) -> tuple[str, ...]:
    """The components of a target (R22, R23), with the quantizing dispatch where it runs."""
    if target.dp > 1:
        if model.quantization is not None:
            return ("gate_routing", DISPATCH_QUANT, EXPERTS, "finalize_copy")
        return ("gate_routing", EXPERTS, "finalize_copy")
    return ("gate_routing", EXPERTS)


class VllmModularSession(ModularObservations, ScaledExpertBanks):
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
        trace: Callable[[Callable[[Any], None]], ProfiledWindow] | None = None,
        resolve: Resolver | None = None,
    ) -> None:
        import torch

        if not surface.complete:
            raise CapabilityError(*surface.missing)
        self._torch = torch
        self.model = model
        self.target = target
        self.surface = surface
        self.dtype_name = dtype
        self.dtype = torch_dtype(dtype)
        # CUDA on the GPU host; a CPU session exists for tests with fakes of vLLM's objects.
        self.device = (
            torch.device("cuda", torch.cuda.current_device())
            if runtime.device == "cuda"
            else torch.device("cpu")
        )
        self.hidden = model.hidden_size
        self.top_k = model.top_k
        self.global_experts = model.global_experts
        self.components = modular_components(model, target)
        self.quantized = model.quantization is not None
        self._stack = contextlib.ExitStack()
        self.banks: list[tuple[Any, ...]] = []
        self.bank_experts: list[Any] = []
        self.w13_scale: Any = None
        self.w2_scale: Any = None
        if activities is None:
            from acquisition.adapters.vllm_ownership import launched_activity_names

            activities = launched_activity_names
        self._activities = activities
        if trace is None and runtime.device == "cuda":
            from acquisition.adapters.vllm_ownership import trace
        # None only for a CPU session without a tracer (tests): no traced forward, and the
        # bundle says its conservation evidence is absent.
        self._trace = trace
        self.ownership: list[dict[str, Any]] = []
        # hold_workspace: allowed once the build has shown vLLM's workspace call launches
        # nothing (``_check_workspace_views``); the views held inside a context; and the
        # (requested, reused) counts of every context so far, for the phase log.
        self.workspace_views: dict[str, Any] = {}
        self._held: _HeldViews | None = None
        self.workspace_reuse = [0, 0]
        # Finds the Triton kernels and Triton's async compile mode for `precompile` (optional
        # symbols: a missing one is skipped, never a refusal).
        self._resolve = resolve
        try:
            self._build(surface, runtime)
        except BaseException:
            self._stack.close()
            raise

    # -- construction -------------------------------------------------------------------

    def _build(self, surface: ApiSurface, runtime: RuntimeInfo) -> None:
        torch = self._torch
        config = self._stack.enter_context(vllm_context(surface))
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
        # Weights: synthetic values in the backend's native layout (FP8 with block scales for
        # a block-FP8 checkpoint, quantized from the same seeded values).
        width = self.model.expert_intermediate_size
        h_scale = self.hidden**-0.5
        w13 = self.random((self.local_experts, 2 * width, self.hidden), seed=2, scale=h_scale)
        w2 = self.random((self.local_experts, self.hidden, width), seed=3, scale=width**-0.5)
        if choice.fp8 is not None:
            self.w13, self.w2, self.w13_scale, self.w2_scale = fp8_weights(
                surface, choice.fp8, w13, w2
            )
            self.quant_config = fp8_quant_config(surface, choice.fp8, self.w13_scale, self.w2_scale)
        else:
            self.w13, self.w2 = surface["kernel_format"](choice.backend, choice.moe_config, w13, w2)
            self.quant_config = surface["unquantized"]
        del w13, w2
        experts = choice.experts_cls(moe_config=choice.moe_config, quant_config=self.quant_config)
        kernel = surface["kernel"](prepare_finalize, experts)
        if getattr(kernel, "is_monolithic", False):
            raise CapabilityError(f"kernel {qualified_name(kernel)} is monolithic")
        self.prepare_finalize = prepare_finalize
        self.experts = experts
        self.kernel = kernel
        self.reduction = experts.finalize_weight_and_reduce_impl()
        reasons, self.deferral_readings = kernel_reasons(
            surface, choice, kernel, experts, prepare_finalize, self.reduction
        )
        if reasons:
            raise CapabilityError(*reasons)

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
        if self._trace is not None:
            started = time.perf_counter()
            budget = runtime.limits.max_num_batched_tokens if runtime.limits else _PROBE_ROWS
            for rows in trace_tokens(budget):
                self.ownership.append(traced_forward(self, rows, self._trace))
            self.build_phases["build.conservation_traces"] = time.perf_counter() - started

    # -- helpers --------------------------------------------------------------------------

    def _bank_experts(self, w13_scale: Any, w2_scale: Any) -> Any:
        """Experts of the native class whose quant config holds one bank's scales."""
        oracle = self.choice.fp8
        if oracle is None:
            raise CapabilityError("an unquantized session has no per-bank scales")
        config = fp8_quant_config(self.surface, oracle, w13_scale, w2_scale)
        return self.choice.experts_cls(moe_config=self.choice.moe_config, quant_config=config)

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

    def dispatch_quantize(self, hidden: Any) -> tuple[Any, Any]:
        """DP+EP: the native prepare's quantization of rows before the all-gather.

        The FP8 values come back as bytes (``uint8`` view) so that references compare exactly.
        """
        a1q, a1q_scale = self._dispatch_quantize_native(hidden)
        return a1q.view(self._torch.uint8), a1q_scale

    def _dispatch_quantize_native(self, hidden: Any) -> tuple[Any, Any]:
        a1q, _scales, a1q_scale = self.surface["dispatch_quantize"](
            hidden, self.quant_config, False
        )
        return a1q, a1q_scale

    def _experts_inputs(self, prepared: _Prepared) -> tuple[Any, Any, Any]:
        """(rows, their scales, expert-token metadata) the experts' ``apply`` receives."""
        if self.choice.prepare_kind == NO_DP_EP:
            a1q, a1q_scale, meta, _ids, _weights = self._prepare(prepared)
            return a1q, a1q_scale, meta
        if prepared.dispatched is not None:
            # DP+EP, quantized: the gathered FP8 rows and their gathered scales.
            return prepared.dispatched, prepared.dispatched_scale, None
        # DP+EP: these rows are what the all-gather delivered (unquantized: no scales).
        return prepared.hidden, None, None

    def _workspace(
        self, experts: Any, a1q: Any, w13: Any, w2: Any, topk_ids: Any, meta: Any
    ) -> tuple[Any, Any]:
        """The workspace views vLLM's modular kernel hands the experts for this forward.

        Inside ``hold_workspace`` the views of the previous forward are handed again while
        the forward's shapes are the previous one's (see there why they are then the very
        views vLLM's call would return); otherwise, and for any other shapes, vLLM's own
        ``moe_problem_size`` and ``_allocate_buffers`` are called, as the kernel does.
        """
        held = self._held
        key = None
        if held is not None and meta is None:
            key = (a1q.shape, a1q.dtype, w13.shape, w2.shape, topk_ids.shape)
            if held.key == key:
                held.reused += 1
                return held.views
        _, tokens, n, k, top_k = experts.moe_problem_size(a1q, w13, w2, topk_ids)
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
        if held is not None:
            # One entry only: views of other shapes are never kept beside these, so a
            # request that grows vLLM's buffer can never leave a stale view behind.
            held.key, held.views = key, (workspace13, workspace2)
            held.requested += 1
        return workspace13, workspace2

    @contextlib.contextmanager
    def hold_workspace(self) -> Iterator[None]:
        """Forwards inside ask vLLM for their workspace views once per shape, not per forward.

        The PointMeter wraps each context of a point (its warmup and timed forwards, and the
        first context's reference check) in this. Why the kernels then get exactly the
        arguments vLLM's own call would give them: vLLM's ``_allocate_buffers`` returns views
        of its workspace manager's one buffer at offsets computed from the requested shapes
        alone (``get_simultaneous``), and replaces that buffer only when a request needs more
        bytes; every forward of a context asks for the same shapes, the first of them (made
        through vLLM's call) already grew the buffer if needed, and nothing else runs on the
        workspace inside a context (the loop runs only this session's experts forwards). So
        every later request of the context would return views equal to the first's, pointers
        included. The call itself launches no device work: checked at build
        (``workspace_views``), and without that proof this holds nothing. It only spares the
        host about 30 us of Python per forward (issue 19, docs/benchmarks.md).
        """
        if not self.workspace_views.get("held_per_context") or self._held is not None:
            yield
            return
        self._held = _HeldViews()
        try:
            yield
        finally:
            held, self._held = self._held, None
            self.workspace_reuse[0] += held.requested
            self.workspace_reuse[1] += held.reused

    def _experts(
        self, prepared: _Prepared, w13: Any, w2: Any, output: Any, experts: Any = None
    ) -> Any:
        """One experts forward into ``output`` (the caller's buffer)."""
        experts = self.experts if experts is None else experts
        topk_weights, topk_ids = prepared.topk_weights, prepared.topk_ids
        a1q, a1q_scale, meta = self._experts_inputs(prepared)
        workspace13, workspace2 = self._workspace(experts, a1q, w13, w2, topk_ids, meta)
        experts.apply(
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
            a2_scale=experts.a2_scale,
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
        return describe_modular(self)

    def local_forward(self, component: str, rows: int) -> Any:
        if component == "gate_routing":
            return GateRoutingForward(self, rows)
        if component == "finalize_copy" and "finalize_copy" in self.components:
            return _FinalizeCopy(self, rows)
        if component == DISPATCH_QUANT and DISPATCH_QUANT in self.components:
            return _DispatchQuant(self, rows)
        raise ValueError(f"vllm-modular has no local component {component!r} for this target")

    def prepare_experts(self, stimulus: RoutingStimulus) -> _Prepared:
        torch = self._torch
        n = stimulus.tokens
        hidden = self.random((n, self.hidden), seed=n + 11)
        prepared = _Prepared(
            hidden=hidden,
            topk_ids=torch.from_numpy(stimulus.topk_ids).to(self.device, self.topk_dtype),
            topk_weights=torch.from_numpy(stimulus.topk_weights).to(self.device),
            output=torch.empty_like(hidden),
            reference_output=torch.empty_like(hidden),
        )
        if self.quantized and self.choice.prepare_kind != NO_DP_EP:
            prepared.dispatched, prepared.dispatched_scale = self._dispatch_quantize_native(hidden)
        return prepared

    def run_experts(self, prepared: _Prepared, bank: int) -> Any:
        weights = self.banks[bank]
        experts = self.bank_experts[bank] if self.bank_experts else None
        return self._experts(prepared, weights[0], weights[1], prepared.output, experts)

    def reference_experts(self, prepared: _Prepared) -> Any:
        if self.choice.prepare_kind == NO_DP_EP:
            self._check_alias(prepared, self._prepare(prepared))
        return self._experts(prepared, self.w13, self.w2, prepared.reference_output)

    def precompile(
        self, stimuli: Sequence[RoutingStimulus], workers: int, configs: int | None = None
    ) -> PrecompileReport:
        """Compile the Triton expert kernels these stimuli's rows will launch, before the
        measuring loop (issue 19; ``acquisition.adapters.triton_precompile`` says how and why
        it changes nothing measured). One dry experts forward per stimulus, on its own inputs
        and output, through the same ``_experts`` call a measured forward makes."""
        from acquisition.adapters.triton_precompile import precompile_stimuli

        def dry(stimulus: RoutingStimulus) -> Any:
            prepared = self.prepare_experts(stimulus)
            return self._experts(prepared, self.w13, self.w2, prepared.output)

        return precompile_stimuli(
            self._resolve, stimuli, dry, workers=workers, synchronize=self.synchronize,
            configs=configs,
        )  # fmt: skip

    def close(self) -> None:
        self.banks = []
        self.bank_experts = []
        self._stack.close()
        if self.device.type == "cuda":
            self._torch.cuda.empty_cache()
