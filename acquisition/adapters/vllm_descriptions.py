"""The contract's ``backend`` description of the vLLM sessions (R32).

What each session is (classes, resolved backend, layouts, dtypes, boundaries, build-time
observations, capabilities read, exclusions and the attribution method), read from the
session; kept apart from the sessions so that each file has one owner.
"""

from __future__ import annotations

from typing import Any

from acquisition.adapters.shared_experts import with_shared_expert_statement
from acquisition.adapters.vllm_capabilities import qualified_name
from acquisition.adapters.vllm_fp8 import DISPATCH_QUANT
from acquisition.adapters.vllm_live_scopes import WRAPPER
from acquisition.adapters.vllm_modular_native import NO_DP_EP
from moetables.bundle import EXPERTS
from moetables.comm import CollectiveStep, TensorWidths, build_trace

__all__ = ["describe_live", "describe_modular", "excluded_collectives"]

ATTRIBUTION = (
    "launch_correlation: CUDA kernels, copies and sets attributed by the "
    "correlation id of their host launch inside each component's range"
)


def _vllm_version() -> str | None:
    try:
        import vllm

        return str(vllm.__version__)
    except Exception:  # recorded only; never decides anything
        return None


def describe_modular(session: Any) -> dict[str, Any]:
    """The ``vllm-modular`` session's contract fields."""
    torch = session._torch
    vllm_version = _vllm_version()
    choice = session.choice
    quantized = choice.fp8 is not None
    if choice.prepare_kind == NO_DP_EP:
        experts_boundary = (
            "native prepare (dynamic FP8 quantization of the activations, per token and "
            "128-column group) + experts.apply into the caller's buffer + native finalize "
            "with the no-op reduction (no copy)"
            if quantized
            else "native prepare (verified input-preserving no-op) + experts.apply into the "
            "caller's buffer + native finalize with the no-op reduction (no copy)"
        )
        if session.target.tp > 1:
            # TP x DP1 with EP (vLLM folds TP into EP): each rank's experts leave a partial
            # sum of every row, which the runner all-reduces over TP after the layer.
            experts_boundary += (
                "; the all-reduce over TP of the partial layer output that follows is a "
                "collective and excluded"
            )
    else:
        experts_boundary = (
            "experts.apply on the gathered rows"
            + (" (FP8 values and their per-group scales)" if quantized else "")
            + " into the caller's buffer + the experts' no-op reduction; dispatch "
            "(all-gather) and combine (reduce-scatter) are collectives and excluded"
        )
    boundaries = {
        "gate_routing": (
            "gate projection (vLLM UnquantizedLinearMethod.apply, the method "
            "ReplicatedLinear.forward calls) + router.select_experts"
        ),
        EXPERTS: experts_boundary,
    }
    quantized_dtypes: dict[str, str] = {}
    if quantized:
        # The all-gather of a quantized DP+EP rank carries FP8 rows and float32 group scales.
        quantized_dtypes = {"weight_scales": _dtype(session.w13_scale)}
        quantized_dtypes["expert_activations"] = "float8_e4m3fn"
        if choice.prepare_kind != NO_DP_EP:
            quantized_dtypes["dispatched_hidden_states"] = "float8_e4m3fn"
            quantized_dtypes["dispatched_scales"] = "float32"
    if DISPATCH_QUANT in session.components:
        boundaries[DISPATCH_QUANT] = (
            "the native prepare's dynamic FP8 quantization of this rank's local rows before "
            "the all-gather (naive_dp_ep._quantize_and_setup_dispatch)"
        )
    if "finalize_copy" in session.components:
        boundaries["finalize_copy"] = (
            "the native finalize's copy of the combined local rows into the layer output"
        )
    described: dict[str, Any] = {
        "name": "vllm-modular",
        "native": True,
        "implementation": f"{type(session).__module__}.{type(session).__name__}",
        "vllm_version": vllm_version,
        "kernel_class": qualified_name(session.kernel),
        "expert_class": qualified_name(session.experts),
        "prepare_finalize_class": qualified_name(session.prepare_finalize),
        "reduction_class": qualified_name(session.reduction),
        "native_backend": choice.backend_label,
        "backend_resolution": (
            choice.fp8.as_dict()["resolution"]
            if choice.fp8 is not None
            else "select_unquantized_moe_backend(FusedMoEConfig of this rank)"
        ),
        "prepare_finalize_kind": choice.prepare_kind,
        "all2all_backend": choice.all2all_backend,
        "router_class": qualified_name(session.router),
        "gate_class": qualified_name(session.gate),
        "expert_map_source": "vllm determine_expert_map (linear placement)",
        "moe_parallel_config": {
            k: getattr(choice.parallel, k)
            for k in ("tp_size", "dp_size", "ep_size", "ep_rank", "dp_rank", "sp_size")
            if hasattr(choice.parallel, k)
        },
        "expert_layout": {
            "w13": {"shape": list(session.w13.shape), "stride": list(session.w13.stride())},
            "w2": {"shape": list(session.w2.shape), "stride": list(session.w2.stride())},
            "conversion": (
                "convert_to_fp8_moe_kernel_format(backend)"
                if quantized
                else "convert_to_unquantized_kernel_format(backend)"
            ),
            **(
                {
                    "w13_scale": {
                        "shape": list(session.w13_scale.shape),
                        "stride": list(session.w13_scale.stride()),
                    },
                    "w2_scale": {
                        "shape": list(session.w2_scale.shape),
                        "stride": list(session.w2_scale.stride()),
                    },
                }
                if quantized
                else {}
            ),
        },
        **({"quantization": _quantization(session)} if quantized else {}),
        "activation": str(getattr(choice.activation, "value", choice.activation)),
        "activation_layout": "standard",
        "routing": {
            **session.model.routing,
            "routing_method": str(getattr(session.router, "routing_method_type", None)),
        },
        "dtypes": {
            "hidden_states": session.dtype_name,
            "expert_weights": str(session.w13.dtype).removeprefix("torch."),
            **quantized_dtypes,
            "gate_weight": str(session.gate.weight.dtype).removeprefix("torch."),
            "router_logits": session.observations.get("router_logits_dtype"),
            "topk_weights": "float32",
            "topk_ids": str(session.topk_dtype).removeprefix("torch."),
        },
        "gate_weight_bytes": session.gate.weight.numel() * session.gate.weight.element_size(),
        "boundaries": boundaries,
        "local_execution": session.observations.get("local_execution"),
        "experts_activities_per_forward": session.observations.get(
            "experts_activities_per_forward"
        ),
        "native_kernel_apply_comparison": session.observations.get(
            "native_kernel_apply_comparison"
        ),
        # Traced forwards of the whole path, scopes per component (vllm_modular_forward):
        # the bundle's conservation.csv.
        "launch_ownership": session.ownership,
        "capabilities": {
            "deferred_finalization": session.deferral_readings,
            "admission": "live API probes (imports, signatures, classes); no version checks",
        },
        "synthetic_weights": "seeded normal values in the native layout",
        "excluded": ["collectives", "cpu_time", "launch_gaps", "shared_experts"],
        "collectives": excluded_collectives(session),
        "attribution": ATTRIBUTION,
        "device_capability": (
            list(torch.cuda.get_device_capability(session.device))
            if session.device.type == "cuda"
            else None
        ),
    }
    return with_shared_expert_statement(described, session.model, component=None)


def excluded_collectives(session: Any) -> dict[str, Any]:
    """The logical collectives this rank's layer runs around its components (R44), named in
    the contract because none of them is in the tables: the estimate charges them with its
    link model (``moetables.comm.build_trace``, the same trace named here)."""
    target = session.target
    torch = session._torch
    hidden_bytes = session.hidden * torch.empty((), dtype=session.dtype).element_size()
    ids_bytes = torch.empty((), dtype=session.topk_dtype).element_size()
    dispatched: int | None = None
    scales = 0
    if session.choice.fp8 is not None and session.choice.prepare_kind != NO_DP_EP:
        # The all-gather moves FP8 rows and one float32 scale per 128-column group.
        dispatched = session.hidden
        scales = -(-session.hidden // session.choice.fp8.block_shape[1]) * 4
    widths = TensorWidths(
        hidden_states=hidden_bytes,
        topk_weights=session.top_k * 4,
        topk_ids=session.top_k * ids_bytes,
        source="the session's dtypes",
        dispatched_hidden_states=dispatched,
        dispatched_scales=scales,
    )
    trace = build_trace(target.tp, target.dp, target.sequence_parallel, session.components, widths)
    return {
        "in_tables": False,
        "charged_by": "moetables.comm link model (cluster description), at estimate time",
        "trace_kind": trace.kind,
        "steps": [
            {
                "op": step.op,
                "tensor": step.tensor,
                "scope": step.scope,
                "groups": [list(group) for group in step.groups],
                "row_bytes": step.row_bytes,
            }
            for step in trace.steps
            if isinstance(step, CollectiveStep)
        ],
    }


def _dtype(tensor: Any) -> str:
    return str(tensor.dtype).removeprefix("torch.")


def _quantization(session: Any) -> dict[str, Any]:
    """What the FP8 experts run on: dtypes, scales, blocks, activation scaling, the oracle."""
    oracle = session.choice.fp8
    block = list(oracle.block_shape)
    return {
        "method": "fp8",
        "weight_dtype": _dtype(session.w13),
        "weight_scale_dtype": _dtype(session.w13_scale),
        "weight_block_shape": block,
        "weight_scales": "one per [block_n, block_k] weight block, stored as vLLM's "
        "weight_scale_inv (dequantized = fp8 value x scale)",
        "activation_dtype": "float8_e4m3fn",
        "activation_quantization": f"dynamic, per token and {block[1]}-column group (1 x "
        f"{block[1]}), float32 scales, by the native prepare",
        "quant_config_class": qualified_name(session.quant_config),
        "synthetic_weights": "the seeded bf16 values quantized per block (scale = block "
        "absolute maximum / 448)",
        "oracle": oracle.as_dict(),
    }


def describe_live(session: Any) -> dict[str, Any]:
    """The ``vllm-live`` session's contract fields."""
    vllm_version = _vllm_version()
    layer = session.layer
    experts = getattr(layer.kernel, "fused_experts", None)
    prepare = getattr(layer.kernel, "prepare_finalize", None)
    backend = getattr(layer.quant_method, "unquantized_backend", None) or getattr(
        layer.quant_method, "fp8_backend", None
    )
    described: dict[str, Any] = {
        "name": "vllm-live",
        "native": True,
        "implementation": f"{type(session).__module__}.{type(session).__name__}",
        "vllm_version": vllm_version,
        "engine": session.engine_settings,
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
            "w13": {"shape": list(session.w13.shape), "stride": list(session.w13.stride())},
            "w2": {"shape": list(session.w2.shape), "stride": list(session.w2.stride())},
        },
        "activation": str(getattr(layer.routed_experts, "activation", None)),
        "dtypes": {
            "hidden_states": session.dtype_name,
            "expert_weights": str(session.w13.dtype).removeprefix("torch."),
            "gate_weight": str(getattr(layer.gate, "weight", session.w13).dtype).removeprefix(
                "torch."
            ),
            "router_logits": session.observations.get("router_logits_dtype"),
            "topk_weights": "float32",
            "topk_ids": str(session.topk_dtype).removeprefix("torch."),
            **(
                {"weight_scales": _dtype(session.w13_scale)}
                if session.w13_scale is not None
                else {}
            ),
        },
        "boundaries": {
            "gate_routing": "the layer's gate projection + router.select_experts",
            EXPERTS: "moe_kernel.apply (native prepare, experts, finalize and output "
            "allocation) with cloned banks; reference: routed_experts.forward_modular",
            WRAPPER: "parent forward minus the gate/router and routed-kernel scopes "
            "(scopes elided; ownership verified on traced native forwards)"
            + (
                ""
                if WRAPPER in session.components
                else "; launches no device activity in this layer (launch_ownership), "
                "so it has no table row"
            ),
        },
        **(
            {"quantization": _live_quantization(session)}
            if session.quant_config is not None
            else {}
        ),
        "launch_ownership": session.ownership,
        "state_checks": "parameter bindings, layouts and version counters; effective MoE "
        "config; callable identities; at build and before every reference comparison",
        "capabilities": {
            "deferred_finalization": session.deferral_readings,
            "admission": "live API probes and the engine layer's state; no version checks",
        },
        "excluded": ["collectives", "cpu_time", "launch_gaps"],
        "attribution": ATTRIBUTION,
    }
    # The build's ownership trace proved the wrapper busy wherever it is planned.
    return with_shared_expert_statement(
        described, session.model, component=WRAPPER if WRAPPER in session.components else None
    )


def _live_quantization(session: Any) -> dict[str, Any] | None:
    """The engine kernel's quantized state as the live session clones it per bank."""
    config = session.quant_config
    if config is None:
        return None
    block = getattr(config, "block_shape", None)
    quant_dtype = getattr(config, "quant_dtype", None)
    return {
        "weight_dtype": _dtype(session.w13),
        "weight_scale_dtype": _dtype(session.w13_scale),
        "weight_block_shape": list(block) if block is not None else None,
        "weight_scale_shapes": {
            "w13": list(session.w13_scale.shape),
            "w2": list(session.w2_scale.shape),
        },
        "activation_dtype": str(quant_dtype).removeprefix("torch."),
        "activation_quantization": (
            f"dynamic, per token and {block[1]}-column group, by the native prepare"
            if block is not None
            else "dynamic per tensor or per token, by the native prepare"
        ),
        "quant_config_class": qualified_name(config),
        "banks": "each bank clones the weights and the weight scales, and runs a kernel of the "
        "engine's classes whose experts read the bank's scales (the engine's prepare/finalize)",
    }
