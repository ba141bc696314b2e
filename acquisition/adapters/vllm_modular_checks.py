"""Build-time evidence of a ``vllm-modular`` session, outside every timed range (R22).

With FP8 activations DP1's prepare quantizes: it must return 8-bit values of the input's shape
and one scale per token and group, and nothing else; its work is part of ``experts``.

DP1's native prepare must return the very input tensor (no scales, no expert-token metadata,
no dispatched ids or weights) and its finalize must work on the caller's buffer, both
launching no device activity; the experts' activities per forward and what vLLM's own
``FusedMoEKernel.apply`` adds beyond the experts boundary are recorded for the contract.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Any

from acquisition.adapters.base import RuntimeInfo
from acquisition.adapters.vllm_capabilities import (
    CapabilityError,
    qualified_name,
)
from moetables.geometry import ExpertGeometry, MoeTarget

if TYPE_CHECKING:
    from collections.abc import Callable

    from acquisition.protocol.stimulus import RoutingStimulus

from acquisition.adapters.vllm_modular_native import NO_DP_EP

__all__ = ["ModularObservations"]

# Tokens of the build-time probes (alias, zero-activity and native-apply observations).
_PROBE_TOKENS = 32


class ModularObservations:
    """The session's build-time checks (a mixin of ``VllmModularSession``)."""

    global_experts: int
    top_k: int
    target: MoeTarget
    local_experts: int
    choice: Any
    gate: Any
    kernel: Any
    prepare_finalize: Any
    reduction: Any
    expert_map: Any
    w13: Any
    w2: Any
    observations: dict[str, Any]
    workspace_views: dict[str, Any]
    experts: Any
    device: Any
    quantized: bool
    _activities: Callable[[Callable[[], Any]], list[str]]

    if TYPE_CHECKING:  # implemented by the session class this mixin is part of

        def prepare_experts(self, stimulus: RoutingStimulus) -> Any: ...

        def _prepare(self, prepared: Any) -> tuple[Any, ...]: ...

        def _experts(self, prepared: Any, w13: Any, w2: Any, output: Any) -> Any: ...

        def _experts_inputs(self, prepared: Any) -> tuple[Any, Any, Any]: ...

        def _workspace(
            self, experts: Any, a1q: Any, w13: Any, w2: Any, topk_ids: Any, meta: Any
        ) -> tuple[Any, Any]: ...

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
        self._check_workspace_views(prepared)
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

    def _check_workspace_views(self, prepared: Any) -> None:
        """Whether ``hold_workspace`` may hand one context's forwards the same views.

        Allowed only on CUDA, where a forward's time is its device activities (R15), and only
        if vLLM's workspace request (``moe_problem_size`` and ``_allocate_buffers``, as
        ``_experts`` calls them) launches no device activity, on a first call (which may grow
        the buffer) and a second: then skipping the repeated requests of a context leaves
        every forward's device work as it was.
        """
        if self.device.type != "cuda":
            # CPU sessions (tests) time a forward by its host operators, and the request's
            # view operations are such operators: holding would change what is timed.
            self.workspace_views = {
                "held_per_context": False,
                "reason": "timed by host operators (CPU), which the workspace request adds",
            }
            return
        a1q, _scale, meta = self._experts_inputs(prepared)
        launched: list[str] = []
        for _ in range(2):
            launched += self._activities(
                lambda: self._workspace(
                    self.experts, a1q, self.w13, self.w2, prepared.topk_ids, meta
                )
            )
        if launched:
            self.workspace_views = {
                "held_per_context": False,
                "reason": f"vLLM's workspace request launches {len(launched)} device "
                f"activities ({', '.join(sorted(set(launched)))})",
            }
        elif meta is not None:
            self.workspace_views = {
                "held_per_context": False,
                "reason": "the experts receive expert-token metadata",
            }
        else:
            self.workspace_views = {
                "held_per_context": True,
                "reason": "vLLM's workspace request launches no device activity",
            }

    def _native_apply(self, prepared: Any) -> Any:
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

    def _check_local_execution(self, prepared: Any) -> None:
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
        if self.quantized:
            self._check_quantized_local_execution(
                prepared, result["prepared"], prepare_activities, finalize_activities
            )
            return
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

    def _check_quantized_local_execution(
        self,
        prepared: Any,
        result: tuple[Any, ...],
        prepare_activities: list[str],
        finalize_activities: list[str],
    ) -> None:
        """DP1 with FP8 activations: prepare quantizes (its work stays in ``experts``) and
        returns nothing else; finalize is still a no-op on the caller's buffer."""
        reasons = self._quantized_prepare_reasons(prepared, result)
        if finalize_activities:
            reasons.append(
                f"native finalize launches {len(finalize_activities)} device activities "
                f"({', '.join(sorted(set(finalize_activities)))}) on the caller's buffer"
            )
        if reasons:
            raise CapabilityError(*reasons)
        a1q, scale = result[0], result[1]
        self.observations["local_execution"] = {
            "prepare": "quantizes the input to "
            f"{str(a1q.dtype).removeprefix('torch.')} {list(a1q.shape)} with "
            f"{str(scale.dtype).removeprefix('torch.')} scales {list(scale.shape)} "
            "(dynamic, per token and weight-block-width group); no expert-token metadata, no "
            f"dispatched ids or weights; {len(prepare_activities)} device activities "
            f"({', '.join(sorted(set(prepare_activities)))}), inside the experts boundary",
            "finalize": f"{qualified_name(self.reduction)} on the caller's buffer "
            "(output is the experts' output): 0 device activities",
            "checked_tokens": prepared.hidden.shape[0],
        }

    def _quantized_prepare_reasons(self, prepared: Any, result: tuple[Any, ...]) -> list[str]:
        a1q, scale, meta, ids, weights = result
        hidden = prepared.hidden
        reasons = []
        if a1q is hidden or a1q.element_size() != 1 or tuple(a1q.shape) != tuple(hidden.shape):
            reasons.append(
                f"native prepare returned {a1q.dtype} {list(a1q.shape)}, not 8-bit activations "
                f"of the input's shape {list(hidden.shape)}"
            )
        block = self.choice.fp8.block_shape[1] if self.choice.fp8 is not None else 0
        groups = -(-hidden.shape[1] // block) if block else -1
        if scale is None or tuple(scale.shape) != (hidden.shape[0], groups):
            reasons.append(
                f"native prepare's activation scales are "
                f"{None if scale is None else list(scale.shape)}, not one per token and "
                f"{block}-column group ({[hidden.shape[0], groups]})"
            )
        if meta is not None:
            reasons.append("native prepare produced expert-token metadata")
        if ids is not None or weights is not None:
            reasons.append("native prepare dispatched top-k ids or weights")
        return reasons

    def _check_alias(self, prepared: Any, result: tuple[Any, ...]) -> None:
        if self.quantized:
            reasons = self._quantized_prepare_reasons(prepared, result)
            if reasons:
                raise CapabilityError(*reasons)
            return
        reasons = self._alias_reasons(prepared, result)
        if reasons:
            raise CapabilityError(*reasons)

    @staticmethod
    def _alias_reasons(prepared: Any, result: tuple[Any, ...]) -> list[str]:
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
