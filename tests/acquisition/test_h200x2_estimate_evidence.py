"""The committed two-H200 evidence of the layer estimate (issue 11 parts 3 and 5; R41, R44, R45).

Made on nvidia-h200-x2 by `scripts/h200x2_estimate_run.sh sweep simulator native` (docs/h200-runs.md,
"Layer estimate on two H200s"). These tests recompute everything shipped from the raw files:
the calibrated cluster description from the sweep, and the comparison with the estimate from the
engine's rank files and the shipped H200 bundle.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from acquisition.estimate_validation import (
    COMPUTE_MAX_GOAL,
    TRANSFER_GOAL,
    dispatch_launches,
    load_forwards,
    run,
)
from moetables.calibration import OPS, fit_group_op_us, fit_sweep, load_sweep
from moetables.comm import load_cluster

ROOT = Path(__file__).resolve().parents[2]
EVIDENCE = ROOT / "docs/evidence/h200x2-estimate"
CLUSTER = ROOT / "clusters/h200x2-nvlink.yaml"
BUNDLE = ROOT / "bundles/H200/Qwen/Qwen3-30B-A3B-Instruct-2507/bf16"
F2 = ROOT / "bundles/H200-vllm-modular-f2/Qwen/Qwen3-30B-A3B-Instruct-2507/bf16"


def test_it_recomputes_the_shipped_cluster_description_from_the_sweep() -> None:
    """R45: clusters/h200x2-nvlink.yaml (version 2) is the fit of the committed raw files: the
    two-ended line and the bandwidth-by-size table from the sweep, group_op_us from the engine's
    equal-count grouped dispatch kernels (native run), with provenance."""
    sweep = load_sweep(EVIDENCE / "nccl_sweep.json")
    assert (
        sweep.ranks == 2 and sweep.meta["gpu"] == "NVIDIA H200" and sweep.meta["nccl"] == "2.28.9"
    )
    assert sweep.meta["env"]["NCCL_NVLS_ENABLE"] == "0"
    for op in OPS:
        sizes = [p.bytes_per_rank for p in sweep.of(op)]
        assert sizes[0] == 4 << 10 and sizes[-1] == 256 << 20 and len(sizes) == 17
        assert all(len(p.iteration_times_us) == 20 for p in sweep.of(op))
    fits = fit_sweep(sweep)
    raw = yaml.safe_load(CLUSTER.read_text())
    shipped = raw["link_classes"]["nvlink"]["collectives"]
    for op in OPS:
        assert shipped[op]["alpha_us"] == round(fits[op].alpha_us, 3)
        assert shipped[op]["bus_bandwidth_GBps"] == round(fits[op].bus_bandwidth_GBps, 2)
        assert shipped[op]["bandwidth_by_size"] == [
            [size, round(bw, 2)] for size, bw in fits[op].bandwidth_by_size
        ]
    launches = dispatch_launches(EVIDENCE, "native", [4096, 32, 32])
    assert [g.sizes_bytes[0] // (2 * 4096) for g in launches] == [4, 64, 256, 1024, 2048]
    group_op = fit_group_op_us(fits, launches)
    assert raw["version"] == 2 and raw["link_classes"]["nvlink"]["group_op_us"] == round(
        group_op, 3
    )
    assert 0.5 < group_op < 3.0
    assert "--group-evidence docs/evidence/h200x2-estimate" in raw["provenance"]["command"]
    assert raw["provenance"]["measured_at"] == "2026-11-30"
    assert "scripts/h200x2_nccl_sweep.py run --nproc 2" in raw["provenance"]["command"]
    assert (
        "NCCL 2.28.9" in raw["provenance"]["software"]
        and "torch 2.11.0+cu130" in raw["provenance"]["software"]
    )
    cluster = load_cluster(CLUSTER)
    assert cluster.ranks() == frozenset({0, 1})
    # The line holds both ends; the middle (NCCL's protocol changes) is where it misses, as documented.
    for op in OPS:
        ends = [abs(m - t) / t for b, t, m in fits[op].residuals if b <= 64 << 10 or b >= 128 << 20]
        assert max(ends) < 0.10
    assert fits["all_gather"].max_relative_error > 0.4
    # The table's leave-one-out error: within 11 % for the gathers and scatters the MoE block runs
    # at equal counts; the broadcast/reduce dip at 4 MiB per rank is the documented exception.
    for op in ("all_gather", "reduce_scatter"):
        assert max(abs(m - t) / t for _, t, m in fits[op].loo_residuals) < 0.11


@pytest.mark.parametrize(
    "routing,router", [("simulator", "RoutingSimulatorRouter"), ("native", "FusedTopKRouter")]
)
def test_it_ran_the_validation_plan_on_a_real_dp2_ep2_engine(routing: str, router: str) -> None:
    """At least 12 steps, equal and unequal counts in [4, 2048]; the kernels vLLM chose per case."""
    forwards, ranks = load_forwards(EVIDENCE, routing)
    info = [r["moe"][0] for r in ranks]
    assert [i["ep_rank"] for i in info] == [0, 1] and all(i["ep_size"] == 2 for i in info)
    assert all(i["router_class"] == router for i in info)
    assert all(i["prepare_finalize"] == "MoEPrepareAndFinalizeNaiveDPEPModular" for i in info)
    assert all(i["experts_class"] == "TritonExperts" and i["local_experts"] == 64 for i in info)
    assert ranks[0]["versions"]["vllm"] == "0.26.0"
    plan = ranks[0]["plan"]
    assert len(plan) >= 12 and all(4 <= n <= 2048 for step in plan for n in step)
    assert any(len(set(s)) == 1 for s in plan) and any(len(set(s)) > 1 for s in plan)
    for f in forwards:
        equal = len(set(f.tokens)) == 1
        # R44: equal counts run AllGather/ReduceScatter; unequal ones vLLM's grouped Broadcast/Reduce.
        want = ("AllGather", "ReduceScatter") if equal else ("Broadcast", "Reduce_Sum")
        assert len(f.nccl_names) == 2
        assert all(w in n for w, n in zip(want, f.nccl_names, strict=True))


def test_it_recomputes_the_committed_comparison_with_the_estimate() -> None:
    """The comparison in docs/benchmarks.md is what the raw files and the shipped bundle give today."""
    result = run(EVIDENCE, str(BUNDLE.relative_to(ROOT)), str(CLUSTER.relative_to(ROOT)))
    committed = json.loads((EVIDENCE / "comparison.json").read_text())
    assert result["summary"].keys() == committed["summary"].keys()
    for key, s in result["summary"].items():
        for field, value in s.items():
            assert value == pytest.approx(committed["summary"][key][field], rel=1e-9), (key, field)
    hist = [r for r in result["forwards"] if r["policy"] == "histogram"]
    # R41: the histogram policy gives every rank exactly the A and M its expert kernel received.
    assert all(
        r["A_measured"] == r["A_estimate"] and r["M_measured"] == r["M_estimate"] for r in hist
    )
    steps = result["steps"]
    # Where the table has a point close by (N <= 514), compute is within the max goal everywhere but
    # at the smallest step, whose A the coarse A-grid interpolates (docs/benchmarks.md explains).
    near = [s for s in steps if 8 < sum(s["tokens"]) <= 514]
    assert near and all(abs(s["compute_error"]) <= COMPUTE_MAX_GOAL for s in near)
    # Transfers (R44/R45: grouped launches, unequal roots one after the other, bandwidth by
    # size): 29 of 30 step-modes within the 25 % goal, the one miss at 25.4 % (docs/benchmarks.md).
    r0 = [s for s in steps if s["rank"] == 0 and s["policy"] == "histogram"]
    errors = [abs(s["transfer_error"]) for s in r0]
    assert len(r0) == 30 and sum(e <= TRANSFER_GOAL for e in errors) >= 29
    assert max(errors) < 0.26 and sorted(errors)[15] < 0.1


def test_it_shows_that_the_compute_miss_at_n4096_is_neither_the_table_nor_the_host(
    tmp_path: Path,
) -> None:
    """The second host: the table re-acquired there and the engine re-run there both reproduce."""
    import statistics
    import tarfile

    from moetables.lookup.tables import ComponentTables

    with tarfile.open(EVIDENCE / "second-host/table-repeat/bundle.tar.gz") as tar:
        tar.extractall(tmp_path, filter="data")
    again = ComponentTables(tmp_path / "modular/H200/Qwen/Qwen3-30B-A3B-Instruct-2507/bf16")
    shipped = ComponentTables(BUNDLE)
    for rank in (0, 1):
        a = again.deployment(1, 2, rank).time_us("experts", 4096, 64, 16384)
        s = shipped.deployment(1, 2, rank).time_us("experts", 4096, 64, 16384)
        assert a == pytest.approx(s, rel=0.01)
    first, _ = load_forwards(EVIDENCE, "simulator")
    second, info = load_forwards(EVIDENCE / "second-host", "simulator")
    assert (
        info[0]["moe"][0]["uuid"]
        != json.loads((EVIDENCE / "validation/simulator/rank0.json").read_text())["moe"][0]["uuid"]
    )
    for step in {f.step for f in first}:
        for rank in (0, 1):
            m1 = statistics.median(f.compute_us[rank] for f in first if f.step == step)
            m2 = statistics.median(f.compute_us[rank] for f in second if f.step == step)
            assert m2 == pytest.approx(m1, rel=0.04)
    # ... and the engine at the table's own point is ~12 % slower than the table on both hosts.
    big = [f for f in first + second if f.tokens == (2048, 2048)]
    assert all(
        f.compute_us[0] > 1.08 * shipped.deployment(1, 2, 0).time_us("experts", 4096, 64, 16384)
        for f in big
    )


def test_it_recomputes_the_comparison_with_the_factor_2_tables() -> None:
    """R44 compute against the factor-2 DP2 tables (points at N = 1024, 2048): the interpolation
    miss is gone where the routing is not the cause (N = 1,110-1,600 within 3 %), and from
    N = 2,048 up the tables read 6-20 % low, the acquisition stimulus' routing (the expert A/B)."""
    result = run(EVIDENCE, str(F2.relative_to(ROOT)), str(CLUSTER.relative_to(ROOT)))
    committed = json.loads((EVIDENCE / "comparison-f2.json").read_text())
    for key, s in result["summary"].items():
        for field, value in s.items():
            assert value == pytest.approx(committed["summary"][key][field], rel=1e-9), (key, field)
    hist = [s for s in result["steps"] if s["policy"] == "histogram"]
    mid = [s for s in hist if 1100 <= sum(s["tokens"]) <= 1600]
    assert len(mid) == 12 and all(abs(s["compute_error"]) <= 0.03 for s in mid)
    small = [s for s in hist if 8 < sum(s["tokens"]) <= 528]
    assert small and all(abs(s["compute_error"]) <= 0.035 for s in small)
    large = [s for s in hist if sum(s["tokens"]) >= 2037]
    assert large and all(-0.21 < s["compute_error"] < -0.05 for s in large)
