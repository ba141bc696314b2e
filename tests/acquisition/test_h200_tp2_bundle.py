"""The shipped TP2/DP1/EP2 Qwen3-30B-A3B bf16 H200 bundle (issue 20, item 3).

Measured on one H200 in session 5 (call 6, `scripts/h200_acquisition_speed.sh
tp2-f2=.:vllm-modular:2:1:420:2` with `--moe-kernel-steps off`; docs/h200-runs.md, "TP2/DP1/EP2
ranks on one GPU"). These checks fail if the bundle is edited or truncated, if its contracts stop
saying whole experts over EP = TP with the TP all-reduce outside the tables (R44, R2-R3), or if
the estimate can no longer answer a TP2/DP1 deployment from it.
"""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import pytest

from moetables.bundle import load_quality, load_table, open_bundle, validate_bundle
from moetables.cli import main as moetables_main

ROOT = Path(__file__).resolve().parents[2]
BUNDLE = ROOT / "bundles/H200-vllm-modular-tp2-f2/Qwen/Qwen3-30B-A3B-Instruct-2507/bf16"
CLUSTER = ROOT / "clusters/h200x2-nvlink.yaml"


def test_it_validates_with_both_ranks_and_every_published_point_passed_b2b() -> None:
    """R38 checksums; R18 every published expert point passed its B/2B control at 3 %."""
    report = validate_bundle(BUNDLE)
    assert report.ok, report.problems
    bundle = open_bundle(BUNDLE)
    assert (bundle.hardware, bundle.model) == ("H200", "Qwen/Qwen3-30B-A3B-Instruct-2507")
    found = {}
    for entry in bundle.entries:
        table = load_table(bundle.root, entry)
        found[(entry.target.tp, entry.target.dp, entry.target.ep, entry.target.rank)] = len(table)
        quality = load_quality(bundle.root, entry, table)
        assert quality.stability is not None and quality.conservation
        published = [r for r in quality.stability if r.published]
        assert len(published) == int((table.component == "experts").sum()) == 559
        assert all(r.passed and r.relative_change <= 0.03 for r in published)
    assert found == {(2, 1, 2, 0): 572, (2, 1, 2, 1): 572}


def test_contracts_say_whole_experts_no_sequence_parallel_and_the_all_reduce_outside() -> None:
    for entry in open_bundle(BUNDLE).entries:
        backend = entry.contract["backend"]
        assert entry.target.sequence_parallel is False
        assert backend["moe_parallel_config"]["tp_size"] == 1  # experts are not tensor-sharded
        assert backend["moe_parallel_config"]["ep_size"] == 2
        assert backend["moe_parallel_config"]["ep_rank"] == entry.target.rank
        assert backend["prepare_finalize_kind"] == "no_dp_ep"
        assert backend["native_backend"] == "TRITON"
        assert entry.contract["components"] == ["gate_routing", "experts"]
        collectives = backend["collectives"]
        assert collectives["in_tables"] is False
        assert [(s["op"], s["groups"]) for s in collectives["steps"]] == [("all_reduce", [[0, 1]])]
        assert "--moe-grid-factor 2" in entry.contract["provenance"]["command_line"]


def test_the_samples_archive_keeps_the_checkpoint_and_logs_without_locks() -> None:
    with tarfile.open(BUNDLE.parent / "bf16.acquisition-samples.tar.gz") as tar:
        names = tar.getnames()
    assert {"run.log", "phases.jsonl", "progress.jsonl", "README.txt"} <= set(names)
    assert not [n for n in names if n.endswith(".lock")]
    samples = {n.split("/")[-2] for n in names if n.endswith("samples.jsonl")}
    assert samples == {"dp1_ep2_rank0_sp0", "dp1_ep2_rank1_sp0"}


@pytest.mark.parametrize("tokens", [1, 300, 2048])
def test_the_estimate_answers_tp2_dp1_from_the_shipped_tables(tokens: int) -> None:
    """docs/estimate.md: both TP ranks see all rows, look up their own table, and the TP
    all-reduce is charged by the cluster's link model on top."""
    text = io.StringIO()
    argv = ["estimate", str(BUNDLE), "--tp", "2", "--dp", "1", "--tokens", str(tokens)]
    assert moetables_main([*argv, "--cluster", str(CLUSTER)], out=text) == 0
    answer = json.loads(text.getvalue())
    assert answer["deployment"]["kind"] == "dp1_modular"
    ranks = answer["ranks"]
    assert [(r["tp_rank"], r["N"]) for r in ranks] == [(0, tokens), (1, tokens)]
    for r in ranks:
        assert set(r["components"]) == {"gate_routing", "experts"}
        assert all(v > 0 for v in r["components"].values())
    [reduce] = answer["collectives"]
    assert (reduce["op"], reduce["ranks"]) == ("all_reduce", [0, 1])
    assert reduce["bytes"] == tokens * 2048 * 2  # layer output rows, hidden 2048, bf16
    assert answer["layer_us"] == pytest.approx(max(r["end_us"] for r in ranks))
    assert answer["layer_us"] > max(r["compute_us"] for r in ranks)
