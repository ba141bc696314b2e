"""Fixtures of the core's tests: the shared real bundle and small synthetic current-layout ones.

Synthetic bundles here exist only inside tests; their times come from a formula stated in
each test, never from a measurement.
"""

from __future__ import annotations

import math
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from moetables.bundle import TableSpec, write_bundle
from moetables.geometry import ExpertGeometry, MoeTarget, linear_expert_map

REPO = Path(__file__).resolve().parents[2]
SHARED = (
    REPO / "bundles" / "llmservingsim-rtxpro6000" / "Qwen" / "Qwen3-30B-A3B-Instruct-2507" / "bf16"
)
if not SHARED.is_dir():
    SHARED = (
        REPO.parent
        / "shared"
        / "data"
        / "llmservingsim-rtxpro6000"
        / "Qwen"
        / "Qwen3-30B-A3B-Instruct-2507"
        / "bf16"
    )

TimeFn = Callable[[int, int, int], float]


def raw_affine(n: int, a: int, m: int) -> float:
    """Affine in raw N/A/M: the default (raw) triangulation reproduces it exactly."""
    return 5.0 + 0.3 * n + 2.0 * a + 0.05 * m


def log_affine(n: int, a: int, m: int) -> float:
    """Affine in log coordinates: log-space interpolation reproduces it exactly."""
    return 5.0 + 3.0 * math.log(n) + 2.0 * math.log(a) + 0.5 * math.log(m)


def expert_points(geometry: ExpertGeometry, tokens: list[int]) -> list[tuple[int, int, int]]:
    points = []
    for n in tokens:
        for a in sorted({1, 2, 3, 4, 6, geometry.local_experts}):
            if a > geometry.local_experts:
                continue
            low, high = geometry.assignment_bounds(n, a)
            if low > high:
                continue
            for m in sorted({low, high, (low + high) // 2, geometry.balanced_total(n)}):
                if geometry.feasible(n, a, m):
                    points.append((n, a, m))
    return points


def make_spec(
    target: MoeTarget,
    *,
    experts: int = 16,
    top_k: int = 4,
    tokens: list[int] | None = None,
    time_fn: TimeFn = raw_affine,
) -> TableSpec:
    tokens = tokens or [1, 2, 4, 8, 16, 32, 64]
    geometry = ExpertGeometry.for_target(experts, top_k, target)
    rows: list[tuple[str, str, int, int, int, float]] = []
    for n in tokens:
        rows.append(("gate_routing", "eager", n, -1, -1, 2.0 + 0.01 * n))
    for n, a, m in expert_points(geometry, tokens):
        rows.append(("experts", "eager", n, a, m, time_fn(n, a, m)))
    components = ["gate_routing", "experts"]
    if geometry.all_remote_possible:
        for n in tokens:
            rows.append(("experts", "eager", n, 0, 0, 1.0 + 0.02 * n))
    if target.dp > 1:
        components.append("finalize_copy")
        for n in tokens:
            rows.append(("finalize_copy", "eager", n, -1, -1, 0.5 + 0.001 * n))
    contract = {
        "target": target.as_dict(),
        "global_experts": experts,
        "global_top_k": top_k,
        "local_experts": geometry.local_experts,
        "expert_map": linear_expert_map(experts, target.ep, target.rank),
        "placement": "linear",
        "local_token_budget": max(tokens),
        "maximum_expert_tokens": max(tokens),
        "components": components,
        "modes": ["eager"],
        "expert_conditioning": {"quality_relative_tolerance": 0.03, "minimum_banks": 2},
        "backend": "synthetic-test-fixture",
    }
    coverage = {
        "complete": True,
        "completed_rounds": 3,
        "conditioning_summary": {
            "checked_points": 10,
            "failed_points": 0,
            "max_relative_change": 0.01,
        },
    }
    return TableSpec(target=target, contract=contract, coverage=coverage, rows=rows)


HEADER = {"hardware": "TESTGPU", "model": "test/tiny-moe", "variant": "bf16"}


@pytest.fixture
def current_bundle(tmp_path: Path) -> Path:
    """TP1/DP2 ranks 0 and 1 and TP1/DP1, E=16, k=4."""
    dest = tmp_path / "bundle"
    specs = [make_spec(MoeTarget.for_rank(1, 2, r)) for r in (0, 1)]
    specs.append(make_spec(MoeTarget.for_rank(1, 1, 0)))
    write_bundle(dest, HEADER, specs)
    return dest


@pytest.fixture
def shared_copy(tmp_path: Path) -> Path:
    """A byte-exact copy of the real LLMServingSim bundle, safe to corrupt."""
    dest = tmp_path / "shared"
    shutil.copytree(SHARED, dest)
    return dest
