"""The shipped TP1/DP4/EP4 and TP1/DP8/EP8 H200 bundles (issue 20, item 3: wider expert
parallelism, every rank measured on one GPU), and the DP4/DP8 layer estimate from them.

Made on one H200 by `scripts/h200_acquisition_speed.sh` (docs/h200-runs.md, "Wider EP on one
GPU"); evidence in docs/evidence/h200-wide-ep/evidence.json (`bench/wide_ep_evidence.py`). These
checks fail if a bundle is edited, truncated, mislabelled, or if a rank's table stops being its
own measurement.
"""

from __future__ import annotations

import csv
import io
import json
import statistics
import tarfile
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from moetables.bundle import validate_bundle
from moetables.lookup import ComponentTables

ROOT = Path(__file__).resolve().parents[2]
MODEL = "Qwen/Qwen3-30B-A3B-Instruct-2507"
BUNDLES = {
    4: ROOT / "bundles/H200-vllm-modular-dp4-f4" / MODEL / "bf16",
    8: ROOT / "bundles/H200-vllm-modular-dp8-f4" / MODEL / "bf16",
}
# Points per rank of the factor-4 plan with capture sizes 1..256 (powers of two): 12 gate and
# 12 finalize rows (N = 1..2048), the rest expert (N, A, M) points of the rank's L local experts.
EXPERT_POINTS = {4: 333, 8: 304}
EVIDENCE = ROOT / "docs/evidence/h200-wide-ep/evidence.json"


def _entries(dp: int) -> list[dict[str, Any]]:
    meta = yaml.safe_load((BUNDLES[dp] / "meta.yaml").read_text())
    entries: list[dict[str, Any]] = meta["per_tp"][1]["moe_components"]["entries"]
    return entries


def _table(dp: int, rank: int, name: str = "components.csv") -> list[dict[str, str]]:
    path = BUNDLES[dp] / "tp1/moe_components" / f"dp{dp}_ep{dp}_rank{rank}_sp0" / name
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


@cache
def _archived_points(dp: int) -> dict[int, dict[str, float]]:
    """Measured point records per rank in the samples archive beside the bundle."""
    archive = BUNDLES[dp].parent / "bf16.acquisition-samples.tar.gz"
    out: dict[int, dict[str, float]] = {}
    with tarfile.open(archive) as tar:
        for member in tar.getmembers():
            if not member.name.endswith("samples.jsonl"):
                continue
            rank = int(member.name.split("_rank")[1].split("_")[0])
            f = tar.extractfile(member)
            assert f is not None
            points: dict[str, float] = {}
            for line in io.TextIOWrapper(f, encoding="utf-8"):
                if '"type": "point"' in line:
                    record = json.loads(line)
                    if record["status"] == "measured":
                        points[record["point"]] = record["time_us"]
            out[rank] = points
    return out


@pytest.mark.parametrize("dp", [4, 8])
def test_it_validates_with_every_rank_of_the_deployment(dp: int) -> None:
    """Issue 20 item 3: TP1/DPx/EPx, every rank; R38: each table's sha256 matches its bytes."""
    report = validate_bundle(BUNDLES[dp])
    assert report.ok, report.problems
    targets = sorted(
        (e["target"]["tp"], e["target"]["dp"], e["target"]["ep"], e["target"]["rank"])
        for e in _entries(dp)
    )
    assert targets == [(1, dp, dp, r) for r in range(dp)]
    rows = sum(len(t.component) for t in report.tables.values())
    assert rows == dp * (EXPERT_POINTS[dp] + 24)


@pytest.mark.parametrize("dp", [4, 8])
def test_each_rank_holds_its_own_local_experts_and_components(dp: int) -> None:
    """R4: a linear expert map of E/EP experts per rank; the three components the adapter owns."""
    local = 128 // dp
    for entry in _entries(dp):
        rank = entry["target"]["rank"]
        contract = entry["contract"]
        assert contract["local_experts"] == local
        expert_map = contract["expert_map"]
        assert [i for i, x in enumerate(expert_map) if x >= 0] == list(
            range(rank * local, (rank + 1) * local)
        )
        assert contract["components"] == ["gate_routing", "experts", "finalize_copy"]
        assert contract["backend"]["name"] == "vllm-modular"
        assert contract["backend"]["vllm_version"] == "0.26.0"
        assert contract["backend"]["moe_parallel_config"]["ep_rank"] == rank
        assert contract["backend"]["expert_layout"]["w13"]["shape"] == [local, 1536, 2048]
        assert contract["provenance"]["device_name"] == "NVIDIA H200"
        command = contract["provenance"]["command_line"]
        assert f"--dp {dp} --backend vllm-modular" in command
        assert "--moe-grid-factor 4" in command
        counts: dict[str, int] = {}
        for row in _table(dp, rank):
            counts[row["component"]] = counts.get(row["component"], 0) + 1
        assert counts == {"gate_routing": 12, "experts": EXPERT_POINTS[dp], "finalize_copy": 12}


@pytest.mark.parametrize("dp", [4, 8])
def test_every_expert_point_passed_its_b_2b_check(dp: int) -> None:
    """R18: every published expert row has a passed control at the method's 3 %, published
    attempt marked; the coverage summary agrees."""
    for entry in _entries(dp):
        rank = entry["target"]["rank"]
        assert entry["contract"]["quality"] == "method"
        coverage = entry["coverage"]
        assert coverage["complete"] is True
        assert coverage["conditioning_summary"]["failed_points"] == 0
        assert coverage["conditioning_summary"]["checked_points"] == EXPERT_POINTS[dp]
        published = [r for r in _table(dp, rank, "stability.csv") if r["published"] == "1"]
        assert len(published) == EXPERT_POINTS[dp]
        assert all(r["passed"] == "1" and float(r["relative_change"]) <= 0.03 for r in published)
        assert all(float(r["tolerance"]) == 0.03 for r in published)
        table = {
            (r["tokens"], r["activated_experts"], r["local_assignments"]): r
            for r in _table(dp, rank)
            if r["component"] == "experts"
        }
        assert {
            (r["tokens"], r["activated_experts"], r["local_assignments"]) for r in published
        } == set(table)


@pytest.mark.parametrize("dp", [4, 8])
def test_every_rank_was_measured_not_copied(dp: int) -> None:
    """Issue 20 item 3: ranks may share measurements only if the contract says so and a repeat
    shows it; neither holds, so each rank's table is its own samples: every row equals a
    measured point of that rank's checkpoint in the archive beside the bundle."""
    archived = _archived_points(dp)
    assert sorted(archived) == list(range(dp))
    hashes = {e["coverage"]["table_sha256"] for e in _entries(dp)}
    assert len(hashes) == dp
    for rank in range(dp):
        for row in _table(dp, rank):
            key = (
                f"{row['component']}:{row['tokens']}"
                if row["component"] != "experts"
                else f"experts:{row['tokens']}:{row['activated_experts']}:{row['local_assignments']}"
            )
            assert archived[rank][key] == pytest.approx(float(row["time_us"]), abs=1e-9), key


def test_rank_agreement_in_the_evidence_is_what_the_tables_give() -> None:
    """The per-rank comparison docs/h200-runs.md reports (experts, each rank against rank 0)."""
    evidence = json.loads(EVIDENCE.read_text())
    for dp in (4, 8):
        base = {
            tuple(r[k] for k in ("tokens", "activated_experts", "local_assignments")): float(
                r["time_us"]
            )
            for r in _table(dp, 0)
            if r["component"] == "experts"
        }
        for rank in range(1, dp):
            other = {
                tuple(r[k] for k in ("tokens", "activated_experts", "local_assignments")): float(
                    r["time_us"]
                )
                for r in _table(dp, rank)
                if r["component"] == "experts"
            }
            assert other.keys() == base.keys()  # identical local geometry, identical plan
            diffs = [abs(other[k] - base[k]) / base[k] for k in base]
            reported = evidence[f"dp{dp}"]["agreement"][f"rank{rank}_vs_rank0"]["experts"]
            assert reported["median_rel_diff"] == pytest.approx(statistics.median(diffs))
            assert reported["max_rel_diff"] == pytest.approx(max(diffs))


def _router_counts(seed: int, n: int) -> np.ndarray:
    """A router-like histogram over 128 experts: n tokens, top-8 distinct experts each."""
    rng = np.random.default_rng(seed)
    picks = np.argsort(rng.random((n, 128)), axis=1)[:, :8]
    counts: np.ndarray = np.bincount(picks.ravel(), minlength=128)
    return counts


@pytest.mark.parametrize("dp", [4, 8])
@pytest.mark.parametrize("policy", ["balanced", "histogram"])
def test_the_layer_estimate_answers_at_dp4_and_dp8(dp: int, policy: str) -> None:
    """R41/R44 (issue 16's rank tables): the TP1/DPx/EPx layer estimate with equal and unequal
    per-rank tokens; no cluster, so the collectives carry bytes and no transfer time. Each rank's
    experts time is its own table's answer at its (N, A, M): no rank borrows another's."""
    tables = ComponentTables(BUNDLES[dp])
    for tokens in ([64] * dp, [16 * (i + 1) for i in range(dp)]):
        n = sum(tokens)
        options: dict[str, Any] = {}
        if policy == "histogram":
            options["expert_counts"] = _router_counts(dp + n, n).tolist()
        layer = tables.estimate(tokens, tp=1, dp=dp, policy=policy, **options)
        via_rank = tables.deployment(1, dp, dp - 1).estimate(tokens, policy=policy, **options)
        assert via_rank.layer_compute_us == layer.layer_compute_us
        assert layer.layer_us is None and layer.cluster is None
        assert len(layer.ranks) == dp
        assert layer.collectives and all(
            c.bytes > 0 and c.transfer_us is None for c in layer.collectives
        )
        local = 128 // dp
        pairs = 0
        for r in layer.ranks:
            assert n == r.N and r.local_rows == tokens[r.dp_rank]
            own = tables.deployment(1, dp, r.rank)
            assert r.components["experts"] == pytest.approx(own.time_us("experts", r.N, r.A, r.M))
            assert r.compute_us > 0
            pairs += r.M
            if policy == "histogram":
                part = options["expert_counts"][r.rank * local : (r.rank + 1) * local]
                assert sum(part) == r.M and sum(c > 0 for c in part) == r.A
        if policy == "histogram":
            assert pairs == n * 8  # the counting policy conserves pairs
        elif len(set(tokens)) == 1:
            # Same (N, A, M) on every rank, yet the ranks' own measurements answer: not merged.
            assert len({(r.N, r.A, r.M) for r in layer.ranks}) == 1
            assert len({r.components["experts"] for r in layer.ranks}) > 1
        assert layer.layer_compute_us >= max(r.compute_us for r in layer.ranks)
