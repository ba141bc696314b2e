"""Contract, coverage and table of a finished target, written with moetables (R32-R35).

The contract says what was measured and how: geometry (gate width apart from the physical
expert width, gate dtype), target and expert ownership, dtypes, the backend (truthfully
``native: false`` for the torch reference), measurement conditioning and attribution, the
sampling policy with its plan hash, and the acquisition observations as provenance. Coverage
stays compact: completion, rounds, the conditioning summary (checked and failed points, the
largest relative change); individual controls stay in samples.jsonl (R34).
"""

from __future__ import annotations

import copy
import json
from typing import TYPE_CHECKING, Any

import yaml

from acquisition.evidence import quality_label
from moetables.bundle import ConservationRow, Row, StabilityRow, TableSpec, write_bundle
from moetables.bundle.reader import META

if TYPE_CHECKING:
    from collections.abc import Sequence
    from pathlib import Path

    from acquisition.plan import PointPlan
    from acquisition.request import AcquisitionRequest

__all__ = ["build_contract", "build_coverage", "publish_target"]

CONTRACT_SCHEMA = "moe-components-contract-v1"


def build_contract(
    request: AcquisitionRequest,
    plan: PointPlan,
    backend: dict[str, Any],
    conditioning: dict[str, Any],
    provenance: dict[str, Any],
) -> dict[str, Any]:
    model = request.model
    target = plan.target
    cuda = request.device == "cuda"
    settings = request.settings
    return {
        "schema": CONTRACT_SCHEMA,
        # A looser B/2B tolerance than the method's 3 % is labelled here, for every reader.
        "quality": quality_label(settings.tolerance),
        "target": target.as_dict(),
        "global_experts": plan.geometry.global_experts,
        "global_top_k": plan.geometry.top_k,
        "local_experts": plan.geometry.local_experts,
        "placement": "linear",
        "expert_map": plan.expert_map,
        "local_token_budget": plan.axes.local_budget,
        "maximum_expert_tokens": plan.axes.expert_maximum,
        "components": list(plan.components),
        "modes": ["eager"],
        "model": {
            "name": model.name,
            "model_type": model.model_type,
            "source": model.source,
            "source_url": model.source_url,
            "config_sha256": model.config_sha256,
            "sequence_parallel_wrapper": model.sequence_parallel,
        },
        "hardware": request.hardware,
        "variant": request.variant,
        "geometry": {**model.geometry, "dtype": request.dtype},
        "backend": backend,
        "expert_weight_bytes": conditioning["expert_weight_bytes"],
        "expert_bank_bytes": conditioning["expert_bank_bytes"],
        "measurement": {
            "execution": "single_rank_emulation",
            "collective_execution": "none",
            "acquisition_processes": 1,
            "acquisition_tp": 1,
            "acquisition_dp": 1,
            "timing": "cuda_activity_sum" if cuda else "cpu_operator_sum",
            "attribution": "launch_correlation_v1" if cuda else "cpu_operator_events_v1",
            "attribution_detail": backend.get("attribution"),
            "representative": "median_of_context_medians",
            "units": "microseconds",
            "rounds": settings.rounds,
            "iterations": settings.iterations,
            "local_warmup_forwards": settings.local_warmup,
            "excluded": ["collectives", "cpu_time", "launch_gaps"],
        },
        "expert_conditioning": {
            "schema": "rotated-weight-sets-v1",
            "cache_bytes": conditioning["cache_bytes"],
            "cache_source": conditioning["cache_source"],
            "capacity_multiple": settings.capacity_multiple,
            "minimum_banks": settings.minimum_banks,
            "banks": conditioning["banks"],
            "expert_bytes": conditioning["expert_bytes"],
            "weight_set": "A local experts of one bank at a rotated position; floor(L/A) per bank",
            "control_sets_rule": "max(minimum_banks, ceil(capacity_multiple * cache_bytes / "
            "(A * expert_bytes))); the published arm cycles through twice as many",
            "control_sets": conditioning["control_sets"],
            "forwards_per_context": "whole multiples of the published arm's cycle, at least "
            "the measurement iterations; identical for both arms",
            "warmup_complete_cycles": settings.warmup_cycles,
            "quality_relative_tolerance": settings.tolerance,
            "quality_statistic": "pooled_median_relative_change",
            "representative": "higher_bank_arm",
            "output_check": "exact_equality_with_cloned_eager_reference",
            "local_components": "isolated_warm",
        },
        "routing_stimulus": "balanced_local_histogram_with_full_global_topk",
        "synthetic_expert_weights": True,
        "expert_sampling": {
            "axes": ["tokens", "activated_experts", "local_assignments"],
            "factor": plan.factor,
            "capture_tokens": {
                "local_rows": list(plan.axes.capture_local_rows),
                "expert_rows": list(plan.axes.capture_expert_rows),
            },
            "point_plan_sha256": plan.sha256,
            "points": len(plan.points),
            **({"kernel_steps": plan.kernel_record()} if plan.kernel is not None else {}),
        },
        "sampling_graph": {
            "source": {
                "cudagraph_mode": plan.mode.value,
                "capture_sizes": plan.captures.as_dict(),
                "max_num_batched_tokens": plan.max_num_batched_tokens,
                "max_num_seqs": plan.max_num_seqs,
            },
            "target": {
                "local_rows": list(plan.axes.capture_local_rows),
                "expert_rows": list(plan.axes.capture_expert_rows),
                "transition_local_rows": plan.axes.transition_local_rows,
                "transition_expert_rows": plan.axes.transition_expert_rows,
            },
        },
        "provenance": provenance,
    }


def build_coverage(
    plan: PointPlan, rounds: int, relative_changes: Sequence[float], failed_points: int
) -> dict[str, Any]:
    points = len(plan.points)
    return {
        "complete": failed_points == 0,
        "points": points,
        "completed_rounds": points * rounds,
        "expected_rounds": points * rounds,
        "conditioning_summary": {
            "checked_points": len(relative_changes) + failed_points,
            "failed_points": failed_points,
            "max_relative_change": max(relative_changes, default=0.0),
        },
    }


def _category_provenance(bundle_dir: Path, moe: dict[str, Any]) -> dict[str, Any]:
    """Root category_provenance with only the MoE category replaced (R8)."""
    existing: dict[str, Any] = {}
    meta_path = bundle_dir / META
    if meta_path.is_file():
        loaded = yaml.safe_load(meta_path.read_bytes())
        if isinstance(loaded, dict) and isinstance(loaded.get("category_provenance"), dict):
            existing = copy.deepcopy(loaded["category_provenance"])
    existing["moe"] = moe
    return existing


def publish_target(
    request: AcquisitionRequest,
    plan: PointPlan,
    rows: Sequence[Row],
    contract: dict[str, Any],
    coverage: dict[str, Any],
    *,
    stability: Sequence[StabilityRow],
    conservation: Sequence[ConservationRow],
    conservation_absent: str | None,
) -> Path:
    """Merge this target's entry and its quality evidence into the bundle (format 2).

    Other targets and categories are kept.
    """
    provenance = contract.get("provenance", {})
    header = {
        "hardware": request.hardware,
        "model": request.model.name,
        "variant": request.variant,
        "category_provenance": _category_provenance(
            request.bundle_dir,
            {
                "source": "acquisition",
                "backend": contract["backend"]["name"],
                "torch_version": provenance.get("torch_version"),
                "profiled_at": provenance.get("started_at"),
            },
        ),
    }
    # Plain JSON types only: meta.yaml is written with yaml.safe_dump.
    contract = json.loads(json.dumps(contract, allow_nan=False))
    coverage = json.loads(json.dumps(coverage, allow_nan=False))
    spec = TableSpec(
        target=plan.target,
        contract=contract,
        coverage=coverage,
        rows=list(rows),
        stability=list(stability),
        conservation=list(conservation),
        conservation_absent=conservation_absent,
    )
    return write_bundle(request.bundle_dir, header, [spec])
