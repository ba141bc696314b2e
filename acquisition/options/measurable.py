"""What each backend can measure, judged from the checkpoint's declarations and the target's
geometry alone (no torch, no vLLM, no device).

The adapters' ``admit`` (acquisition/adapters) call these rules for their declared part and add
what only a running process can tell (a CUDA device, vLLM's live API, the backend vLLM selects).
The registry calls the same rules before it accepts a request for a gap of the coverage matrix
or shows a Request button, so a cell that no acquisition of that backend could ever fill (the
live path at DP2, R25) is refused with the adapter's own reason rather than queued as a job
that fails at admission.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

from acquisition.catalog import CatalogError, catalog_models, resolve_model
from acquisition.options.schema import BACKEND_NAMES
from moetables.geometry import MoeTarget

if TYPE_CHECKING:
    from acquisition.catalog import MoeModel

__all__ = [
    "MEASURING_BACKENDS",
    "backend_target_problem",
    "cell_problem",
    "checkpoint_reasons",
    "declared_reasons",
]

# The named backends that measure (``auto`` chooses among them).
MEASURING_BACKENDS = tuple(name for name in BACKEND_NAMES if name != "auto")


def checkpoint_reasons(model: MoeModel, *, quantized_allowed: bool) -> list[str]:
    """Checkpoint properties that no vLLM adapter here can measure faithfully (R28)."""
    reasons: list[str] = []
    if model.expert_bias:
        reasons.append("biased experts: expert MLP biases are not admitted (R28)")
    if model.scoring not in ("softmax", "sigmoid"):
        reasons.append(
            f"router scoring {model.scoring!r}: only plain softmax or sigmoid top-k routing "
            "is replayed"
        )
    if model.quantization and not quantized_allowed:
        reasons.append(
            f"quantized checkpoint ({model.quantization}): this adapter measures unquantized "
            "native modular experts only and never stands in for a quantized kernel"
        )
    return reasons


def _live(model: MoeModel, target: MoeTarget) -> list[str]:
    reasons = []
    if (target.tp, target.dp, target.ep) != (1, 1, 1) or target.sequence_parallel:
        reasons.append(
            f"target TP{target.tp}/DP{target.dp}/EP{target.ep}"
            f"{' with sequence parallelism' if target.sequence_parallel else ''}: the live path "
            "measures the engine's layer at TP1/DP1/EP1 only (R25)"
        )
    return reasons + checkpoint_reasons(model, quantized_allowed=True)


def _modular(model: MoeModel, target: MoeTarget) -> list[str]:
    # Shared experts alone are no reason to decline: the modular components are the routed
    # path's (R21-R23), and the contract says the shared expert is not in them
    # (acquisition/adapters/shared_experts.py).
    return checkpoint_reasons(model, quantized_allowed=True) + block_fp8_reasons(model)


# vLLM's block FP8 MoE keys (kFp8Static128BlockSym weights, 128-column activation groups).
FP8_BLOCK = (128, 128)


def block_fp8_reasons(model: MoeModel) -> list[str]:
    """Why a quantized checkpoint is not block FP8 as vllm-modular emulates it (empty: it is)."""
    if model.quantization is None:
        return []
    if model.quantization != "fp8":
        return [
            f"quantized checkpoint ({model.quantization}): vllm-modular emulates block-wise FP8 "
            "experts only and never stands in for another quantized kernel"
        ]
    reasons = []
    if model.weight_block_size is None:
        reasons.append(
            "per-tensor FP8 (no weight_block_size): only block-wise FP8 experts are emulated"
        )
    elif tuple(model.weight_block_size) != FP8_BLOCK:
        reasons.append(
            f"FP8 weight blocks {list(model.weight_block_size)}: vLLM's block FP8 keys are "
            f"{list(FP8_BLOCK)}"
        )
    if model.activation_scheme not in (None, "dynamic"):
        reasons.append(
            f"activation_scheme {model.activation_scheme!r}: block FP8 quantizes activations "
            "dynamically"
        )
    if model.quant_format not in (None, "e4m3"):
        reasons.append(f"FP8 format {model.quant_format!r}: only e4m3 weights are emulated")
    width = model.expert_intermediate_size
    if model.weight_block_size is not None and (
        width % model.weight_block_size[0] or model.hidden_size % model.weight_block_size[1]
    ):
        reasons.append(
            f"expert width {width} or hidden size {model.hidden_size} is not a multiple of the "
            f"weight block {list(model.weight_block_size)}"
        )
    return reasons


def _reference(model: MoeModel, target: MoeTarget) -> list[str]:
    reasons: list[str] = []
    if model.activation != "silu":
        reasons.append(
            f"activation {model.activation!r}: the reference MLP implements SiLU-and-mul only"
        )
    if model.scoring != "softmax":
        reasons.append(f"router scoring {model.scoring!r}: the reference routes by softmax only")
    reasons.extend(_grouping_reasons(model))
    if model.expert_bias:
        reasons.append("biased experts: the reference MLP has no expert biases (R28)")
    if model.router_bias:
        reasons.append("router bias: the reference gate is a plain linear layer")
    if model.quantization:
        reasons.append(
            f"quantized checkpoint ({model.quantization}): the reference runs unquantized "
            "experts and never stands in for a quantized kernel"
        )
    return reasons


def _grouping_reasons(model: MoeModel) -> list[str]:
    """Grouped routing the reference's plain softmax top-k would not reproduce.

    Keeping every group (topk_group == groups, one group included) chooses as a plain top-k
    does; fewer groups, a routed scale or a score bias change the choice or the weights.
    """
    if model.grouped_topk is None:
        return []
    groups, kept = model.grouped_topk
    reasons = []
    if kept < groups:
        reasons.append(
            f"grouped routing keeps {kept} of {groups} expert groups: the reference routes by "
            "a plain top-k over all experts"
        )
    if model.routed_scaling_factor != 1.0:
        reasons.append(
            f"routed_scaling_factor {model.routed_scaling_factor}: the reference does not scale "
            "the routed weights"
        )
    if model.score_correction_bias:
        reasons.append("score correction bias (noaux_tc): the reference router has none")
    return reasons


_RULES = {"vllm-live": _live, "vllm-modular": _modular, "torch-reference": _reference}


def declared_reasons(backend: str, model: MoeModel, target: MoeTarget) -> list[str]:
    """Why ``backend`` cannot measure ``target`` of ``model`` (empty: nothing declared
    forbids it; the adapter's admission on the GPU host still has the last word)."""
    rule = _RULES.get(backend)
    if rule is None:
        return [_unknown_backend(backend)]
    return rule(model, target)


def _unknown_backend(backend: str) -> str:
    return (
        f"{backend!r} is not a backend this acquisition runs "
        f"(one of {', '.join(MEASURING_BACKENDS)})"
    )


def backend_target_problem(backend: str, model: MoeModel, target: MoeTarget) -> str | None:
    """``declared_reasons`` as one sentence, or None when the cell can be measured."""
    reasons = declared_reasons(backend, model, target)
    return "; ".join(reasons) if reasons else None


@functools.cache
def _catalog_model(name: str) -> MoeModel | None:
    # Catalog ids only: a registry never reads a folder a request names.
    if name not in catalog_models():
        return None
    try:
        return resolve_model(name)
    except CatalogError:
        return None


def cell_problem(
    backend: str, model: str, *, tp: int, dp: int, rank: int, sequence_parallel: bool
) -> str | None:
    """Why a coverage cell (a catalog model's deployment rank, by one backend) cannot be
    measured, or None when a job of that backend could fill it."""
    if backend not in _RULES:
        return _unknown_backend(backend)
    found = _catalog_model(model)
    if found is None:
        return f"{model} is not in the acquisition catalog"
    try:
        target = MoeTarget(tp, dp, tp * dp, rank, sequence_parallel)
    except ValueError as exc:
        return str(exc)
    return backend_target_problem(backend, found, target)
