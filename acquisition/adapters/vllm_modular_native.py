"""What vLLM resolves for one target rank of ``vllm-modular``, before anything is allocated.

The rank's ``FusedMoEParallelConfig`` (filled as vLLM's ``make`` would for full EP), the
linear expert map from ``determine_expert_map``, the router, the ``FusedMoEConfig`` and the
native expert backend that vLLM's oracle selects for it (the unquantized oracle, or for a
block-FP8 checkpoint the FP8 oracle as ``Fp8MoEMethod`` calls it), with the checks that
decline what one GPU cannot emulate (monolithic or batched experts, other all-to-all kinds).
"""

from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from acquisition.adapters.vllm_capabilities import (
    MODULAR_PARAMETERS,
    ApiSurface,
    CapabilityError,
    check_parameters,
    deferral_reasons,
    qualified_name,
)
from acquisition.adapters.vllm_fp8 import Fp8Oracle, select_fp8
from moetables.geometry import MoeTarget, linear_expert_map

if TYPE_CHECKING:
    from collections.abc import Iterator

    from acquisition.catalog import MoeModel

__all__ = [
    "NAIVE_DP_EP",
    "NO_DP_EP",
    "NativeChoice",
    "class_reasons",
    "kernel_reasons",
    "resolve_native",
    "router_grouping",
    "torch_dtype",
    "vllm_context",
]

NO_DP_EP = "no_dp_ep"
NAIVE_DP_EP = "naive_dp_ep"


def torch_dtype(name: str) -> Any:
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
    # Block FP8: vLLM's FP8 oracle's choice and why the backends before it declined.
    fp8: Fp8Oracle | None = None

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


def router_grouping(model: MoeModel, device: Any) -> dict[str, Any]:
    """The grouped top-k arguments the model's vLLM wrapper gives its router (none: plain).

    DeepseekV2MoE passes ``use_grouped_topk=True`` with the config's groups, scale and, for
    ``noaux_tc``, a float32 score-correction bias per expert; the factory then builds
    GroupedTopKRouter, whose kernels are what gate_routing must time. The bias is synthetic
    (zeros), like every other weight here: it moves which experts win, not what runs.
    """
    if model.grouped_topk is None:
        return {}
    groups, topk_group = model.grouped_topk
    arguments: dict[str, Any] = {
        "use_grouped_topk": True,
        "num_expert_group": groups,
        "topk_group": topk_group,
        "routed_scaling_factor": model.routed_scaling_factor,
    }
    if model.score_correction_bias:
        import torch

        arguments["e_score_correction_bias"] = torch.zeros(
            model.global_experts, dtype=torch.float32, device=device
        )
    return arguments


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
        **router_grouping(model, device),
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
    fp8: Fp8Oracle | None = None
    if model.quantization is not None:
        fp8 = select_fp8(surface, moe_config, model)
        backend, experts_cls = fp8.backend, fp8.experts_cls
    else:
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
    layout = cast("Any", experts_cls).activation_format()  # vLLM's class, untyped here
    if layout != standard:
        raise CapabilityError(
            f"native experts {qualified_name(experts_cls)} use the "
            f"{layout} activation layout, not the standard one"
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
        fp8=fp8,
    )


@contextlib.contextmanager
def vllm_context(surface: ApiSurface) -> Iterator[Any]:
    """A default VllmConfig made current, as vLLM's own kernel tests run modules."""
    config = surface["vllm_config"]()
    with surface["set_vllm_config"](config):
        yield config


def class_reasons(surface: ApiSurface) -> list[str]:
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


def kernel_reasons(
    surface: ApiSurface,
    choice: NativeChoice,
    kernel: Any,
    experts: Any,
    prepare_finalize: Any,
    reduction: Any,
) -> tuple[list[str], Any]:
    """Why the built kernel cannot be timed at the audited boundaries (empty: it can), and
    the deferral attributes read on its parts."""
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
        f"{qualified_name(reduction)}.apply",
        reduction.apply,
        MODULAR_PARAMETERS["reduction.apply"],
    )
    if not callable(getattr(getattr(kernel, "impl", None), "_allocate_buffers", None)):
        reasons.append(
            f"unsupported API: {qualified_name(kernel)}.impl has no _allocate_buffers "
            "(the native workspace allocation)"
        )
    if not isinstance(reduction, surface["noop_reduction"]):
        reasons.append(
            f"the experts' reduction is {qualified_name(reduction)}, not the no-op "
            "reduction: finalization would need weighting or a copy outside the audited "
            "boundaries"
        )
    if getattr(experts, "expects_unquantized_inputs", False):  # a property on real experts
        reasons.append("the experts defer input quantization: prepare is not a no-op")
    deferral, readings = deferral_reasons(
        {
            "kernel": kernel,
            "kernel.impl": getattr(kernel, "impl", None),
            "prepare_finalize": prepare_finalize,
            "experts": experts,
            "moe_config": choice.moe_config,
        }
    )
    reasons += deferral
    return reasons, readings
