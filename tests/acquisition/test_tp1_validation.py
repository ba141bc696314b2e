"""The TP1 engine validation (issue 18 part 3): the DP1 step plan and the CPU analysis of a DP1 run.

The GPU side (`scripts/h200x2_estimate_validation.py run --dp 1`) needs vLLM; here its output is
stood in for by rank files of the same shape whose per-expert counts are drawn like the routing
simulator's and whose measured compute is a known multiple of the estimate, so the goal
arithmetic can be checked against numbers known in advance.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from acquisition.estimate_validation import (
    ISSUE18_GOALS,
    ValidationDataError,
    distinct_choice_forwards,
    load_forwards,
    local_load,
    routing_kernels_us,
    routings_in,
    run,
)
from moetables.lookup.tables import ComponentTables
from tests.json_close import json_close

ROOT = Path(__file__).resolve().parents[2]
F2 = "bundles/H200-vllm-modular-f2/Qwen/Qwen3-30B-A3B-Instruct-2507/bf16"
E, K = 128, 8


def _probe() -> Any:
    spec = importlib.util.spec_from_file_location(
        "h200x2_estimate_validation", ROOT / "scripts/h200x2_estimate_validation.py"
    )
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def test_the_dp1_plan_steps_n_from_1_to_2000_and_the_table_point_2048() -> None:
    plan = _probe().step_plan(1)
    tokens = [step[0] for step in plan]
    assert all(len(step) == 1 for step in plan)
    assert tokens == sorted(set(tokens)) and tokens[0] == 1 and 2000 in tokens
    assert tokens[-1] == 2048  # the engine's max_num_batched_tokens
    assert sum(1 < n < 2048 and n & (n - 1) for n in tokens) >= 10  # off the tables' 2^k points
    with pytest.raises(ValueError):
        _probe().step_plan(0)


def _counts(rng: np.random.Generator, n: int, skew: bool) -> list[int]:
    weights = np.exp(rng.normal(0.0, 1.0, E)) if skew else np.ones(E)
    ids = [rng.choice(E, size=K, replace=False, p=weights / weights.sum()) for _ in range(n)]
    return np.bincount(np.concatenate(ids), minlength=E).tolist()


def _fake_dp1_run(
    evidence: Path, routing: str, factor: float, tile_cost_us: float, skew: bool
) -> None:
    """A DP1 rank file whose measured compute is ``factor`` x the estimate of its own counts."""
    rng = np.random.default_rng(5)
    plan = [[n] for n in (1, 16, 256, 777, 2000)]
    reps = 2
    tables = ComponentTables(ROOT / F2)
    blocks = []
    for _rep in range(reps):
        for (n,) in plan:
            counts = _counts(rng, n, skew)
            est = tables.estimate(
                [n],
                tp=1,
                dp=1,
                policy="histogram",
                expert_counts=counts,
                tile_cost_us=tile_cost_us,
            )
            blocks.append(
                {
                    "tokens": n,
                    "expert_counts": counts,
                    "compute_us": factor * est.layer_compute_us,
                    "nccl_us": [],
                    "nccl_names": [],
                }
            )
    rank = {
        "rank": 0,
        "dp": 1,
        "ok": True,
        "routing": "simulator",
        "plan": plan,
        "reps": reps,
        "moe": [{"top_k": K, "expert_map": None, "ep_size": 1, "local_experts": E}],
        "blocks": blocks,
    }
    out = evidence / "validation" / routing
    out.mkdir(parents=True)
    (out / "rank0.json").write_text(json.dumps(rank))


def test_it_compares_a_dp1_run_without_a_cluster_and_judges_issue_18s_goal(
    tmp_path: Path,
) -> None:
    """Issue 18 part 3: uniform within 2 % median / 5 % worst, skewed within 5 %. A run measuring
    3 % above the estimate everywhere meets the skewed goal and misses the uniform one."""
    _fake_dp1_run(tmp_path, "simulator", 1.03, 1.6, skew=False)
    _fake_dp1_run(tmp_path, "normal_routing", 1.03, 1.6, skew=True)
    assert routings_in(tmp_path) == ["simulator", "normal_routing"]
    result = run(tmp_path, F2, None, tile_cost_us=1.6)
    goal = result["issue18"]
    for routing in ("simulator", "normal_routing"):
        g = goal[routing]
        assert g["error_median_signed"] == pytest.approx(1 / 1.03 - 1)
        assert g["abs_error_max"] == pytest.approx(1 - 1 / 1.03)
        assert (g["goal_median"], g["goal_max"]) == ISSUE18_GOALS[routing]
        assert g["step_ranks"] == 5
    assert goal["simulator"]["within_goal"] is False
    assert goal["normal_routing"]["within_goal"] is True
    hist = [r for r in result["forwards"] if r["policy"] == "histogram"]
    # R41: the captured counts give the estimate exactly the A and M the kernel received.
    assert all(r["A_measured"] == r["A_estimate"] for r in hist)
    assert all(r["M_measured"] == r["M_estimate"] == K * r["N"] for r in hist)
    # No collectives at DP1: nothing compared, no transfer statistics.
    assert all(s["transfer_error"] is None for s in result["steps"])
    assert "transfer_abs_error_median" not in result["summary"]["simulator/histogram"]
    # The balanced policy is compared too (today's answer): A from the expectation, not the counts.
    assert "normal_routing/balanced" in result["summary"]


def test_a_dp1_run_measured_as_estimated_is_within_the_goal_and_a_charge_matters(
    tmp_path: Path,
) -> None:
    """The same counts without the tile charge give other numbers: the charge reaches the goal."""
    _fake_dp1_run(tmp_path, "simulator", 1.0, 1.6, skew=False)
    charged = run(tmp_path, F2, None, tile_cost_us=1.6)["issue18"]["simulator"]
    assert charged["abs_error_max"] == pytest.approx(0.0, abs=1e-12) and charged["within_goal"]
    plain = run(tmp_path, F2, None)["issue18"]["simulator"]
    assert plain["error_max_signed"] < -1e-3  # N = 2,000 runs more tiles than the table's balanced


def test_a_dp2_run_still_needs_its_cluster(tmp_path: Path) -> None:
    evidence = ROOT / "docs/evidence/h200x2-estimate"
    with pytest.raises(ValidationDataError, match="cluster"):
        run(evidence, F2, None)
    assert local_load(np.array([0, 3, 2, 0]), None) == (2, 5)
    assert local_load(np.array([0, 3, 2, 0]), [0, 1, -1, -1]) == (1, 3)
    forwards, _ = load_forwards(evidence, "native")
    assert forwards and len(forwards[0].tokens) == 2


def test_the_routing_kernels_end_where_the_expert_path_starts() -> None:
    """Issue 18 part 3: the block less its routing kernels is the expert path the table's experts
    component models; at one token the path starts with the int fill, not the alignment."""
    acts = [
        ["nvjet_gate", "kernel", 0.0, 5.0],
        ["distribution_elementwise_grid_stride_kernel", "kernel", 1.0, 1.5],
        ["ncclDevKernel_AllGather", "kernel", 2.0, 40.0],
        ["void vllm::moe::moe_align_block_size_kernel<long>", "kernel", 3.0, 3.0],
        ["fused_moe_kernel", "kernel", 4.0, 80.0],
    ]
    assert routing_kernels_us(acts) == pytest.approx(6.5)
    one = [acts[0], ["vectorized_elementwise_kernel<4, FillFunctor<int>", "kernel", 1, 0.8]]
    assert routing_kernels_us(one) == pytest.approx(5.0)
    assert routing_kernels_us(acts[:2]) is None  # no expert kernel: nothing to split


def test_duplicate_choices_of_the_simulator_are_left_out_and_listed(tmp_path: Path) -> None:
    """vLLM's simulator may give one token the same expert twice; the lookups refuse a count above
    N, so that forward is left out of the comparison (and named) instead of failing the run."""
    _fake_dp1_run(tmp_path, "simulator", 1.0, 1.6, skew=False)
    path = tmp_path / "validation/simulator/rank0.json"
    rank = json.loads(path.read_text())
    counts = [0] * E
    counts[3], counts[7] = 2, 6  # N = 1: 8 pairs on 2 experts, one of them twice
    rank["blocks"][0]["expert_counts"] = counts
    path.write_text(json.dumps(rank))
    forwards, _ = load_forwards(tmp_path, "simulator")
    kept, left = distinct_choice_forwards(forwards)
    assert len(kept) == len(forwards) - 1
    assert left == [
        {
            "routing": "simulator",
            "rep": 0,
            "step": 0,
            "tokens": [1],
            "max_count": 6,
            "reason": "an expert has more pairs than there are tokens (duplicate choices)",
        }
    ]
    result = run(tmp_path, F2, None, tile_cost_us=1.6)
    assert result["left_out"] == left
    step0 = [s for s in result["steps"] if s["step"] == 0 and s["policy"] == "histogram"]
    assert step0[0]["reps"] == 1


def test_the_h200_tp1_evidence_gives_the_documented_goal_numbers() -> None:
    """docs/benchmarks.md, "TP1 engine validation": the committed comparison is what the committed
    raw run gives with the factor-2 TP1 table and 1.416 us per extra tile (R41)."""
    evidence = ROOT / "docs/evidence/h200-tp1-validation"
    result = run(evidence, F2, None, tile_cost_us=1.416)
    kept = json.loads((evidence / "comparison-f2-tiles.json").read_text())
    assert json_close(result["issue18"], kept["issue18"])
    assert len(result["left_out"]) == 3 and {f["step"] for f in result["left_out"]} == {0}
    goal = result["issue18"]
    # The expert path with the tile charge: within 5 % from N = 1,024 on under both routers.
    for routing in ("simulator", "normal_routing"):
        big = [
            abs(s["experts_error"])
            for s in result["steps"]
            if s["routing"] == routing and s["policy"] == "histogram" and s["tokens"][0] >= 1024
        ]
        assert len(big) == 8 and max(big) < 0.05
        assert goal[routing]["within_goal"] is False  # N = 384 and 777: not tiles


F2K = "bundles/H200-vllm-modular-f2k/Qwen/Qwen3-30B-A3B-Instruct-2507/bf16"


def test_the_kernel_step_table_and_the_native_run_give_the_documented_numbers() -> None:
    """docs/benchmarks.md, "TP1 with the kernel-step tables and the engine's own router": the
    committed f2k comparison is what the committed raw runs (native included) give; N = 384 is
    a measured row of the kernel-step table (no interpolation) and the engine is still about
    10 % above it: the remaining miss there is not the grid (R41)."""
    evidence = ROOT / "docs/evidence/h200-tp1-validation"
    result = run(evidence, F2K, None, tile_cost_us=1.416)
    kept = json.loads((evidence / "comparison-f2k-tiles.json").read_text())
    assert json_close(result["issue18"], kept["issue18"])
    assert {"simulator", "normal_routing", "native"} <= set(result["issue18"])
    table = ComponentTables(ROOT / F2K).deployment(1, 1, 0)
    for routing in ("simulator", "native"):
        at384 = [
            f
            for f in result["forwards"]
            if f["routing"] == routing and f["policy"] == "histogram" and f["N"] == 384
        ]
        assert len(at384) == 3
        for f in at384:
            assert (f["A_estimate"], f["M_estimate"]) == (128, 3072)
            assert f["components_estimate_us"]["experts"] == table.time_us(
                "experts", 384, 128, 3072
            )
            assert -0.12 < f["experts_estimate_us"] / f["experts_measured_us"] - 1 < -0.07
    native = result["issue18"]["native"]
    assert native["within_goal"] is False and native["abs_error_median"] < 0.03


@pytest.mark.parametrize("bundle", [F2, F2K], ids=["f2", "f2k"])
def test_the_wave_charge_gives_the_documented_numbers(bundle: str) -> None:
    """docs/benchmarks.md, "The wave charge, built in": with each table's recorded models
    (bundle format 5: 128/64-row costs per tile, 32-row per wave; tile_cost_us='table') the
    committed comparison is what the committed raw runs give; against format 4's 32-row tile
    cost (comparison-*-blocks.json) only 32-row steps move, and N = 384 under uniform routing
    and the engine's own router moves from 7-9 % under to within 4.5 %."""
    evidence = ROOT / "docs/evidence/h200-tp1-validation"
    name = "f2" if bundle == F2 else "f2k"
    result = run(evidence, bundle, None, tile_cost_us="table")
    kept = json.loads((evidence / f"comparison-{name}-waves.json").read_text())
    assert json_close(result["issue18"], kept["issue18"])
    assert json_close(result["steps"], kept["steps"])
    before = json.loads((evidence / f"comparison-{name}-blocks.json").read_text())

    def key(s: dict[str, Any]) -> tuple[str, str, int]:
        return s["routing"], s["policy"], s["tokens"][0]

    old = {key(s): s for s in before["steps"]}
    # Moved beyond a millionth: the balanced reference across a block switch became N's own
    # (2026-12-01), which shifts other steps by parts in 1e9, not what this asks.
    moved = {
        k[2]
        for s in result["steps"]
        if (k := key(s)) and not json_close(s, old[k], rel=1e-6, absolute=1e-6)
    }
    assert moved and moved <= {200, 256, 384}  # the 32-row steps only
    at384 = {s["routing"]: s for s in result["steps"] if key(s)[1:] == ("histogram", 384)}
    for routing in ("simulator", "native"):
        assert old[key(at384[routing])]["compute_error"] < -0.07
        assert -0.045 < at384[routing]["compute_error"] < 0


LIVE_F2K4 = "bundles/H200-vllm-live-f2k4/Qwen/Qwen3-30B-A3B-Instruct-2507/bf16"
MODULAR_F2K4 = "bundles/H200-vllm-modular-f2k4/Qwen/Qwen3-30B-A3B-Instruct-2507/bf16"


@pytest.mark.parametrize("bundle", [LIVE_F2K4, MODULAR_F2K4], ids=["live", "modular"])
def test_the_rule_v4_tables_give_the_documented_numbers(bundle: str) -> None:
    """docs/benchmarks.md, "TP1 goal with the rule-v4 tables and the wave charge": the committed
    comparisons are what the committed raw runs give with the v4 tables' recorded models; with
    the live table the issue-18 goal holds for uniform routing on the MoE block and for skewed
    routing on the expert path, and not for the skewed block (the routing simulator's own
    kernels at small N) (R41)."""
    evidence = ROOT / "docs/evidence/h200-tp1-validation"
    name = "live" if bundle == LIVE_F2K4 else "modular"
    result = run(evidence, bundle, None, tile_cost_us="table")
    kept = json.loads((evidence / f"comparison-{name}-f2k4-waves.json").read_text())
    assert json_close(result["issue18"], kept["issue18"])
    goal = result["issue18"]
    if name == "live":
        assert goal["simulator"]["within_goal"] is True
        assert goal["normal_routing"]["experts_only"]["within_goal"] is True
        assert goal["normal_routing"]["within_goal"] is False
        at1 = [
            s
            for s in result["steps"]
            if s["routing"] == "normal_routing" and s["policy"] == "histogram"
            if s["tokens"][0] == 1
        ]
        assert at1 and at1[0]["compute_error"] < -0.15 and abs(at1[0]["experts_error"]) < 0.05
    else:
        assert goal["simulator"]["within_goal"] is False  # -5.1 % at its worst step
