"""The shipped Qwen1.5-MoE-A2.7B and Mixtral-8x7B-Instruct H200 bundles (issue 20, item 2).

Measured on one H200 by `scripts/h200_models.sh` (docs/h200-runs.md, "Two more model families",
calls 10-12 of the fourth session); evidence in docs/benchmarks.md from `bench/models_evidence.py`.
These checks fail if a bundle is edited, truncated or mislabelled, if the Qwen1.5 live table
stops carrying the shared expert in its wrapper rows (R26), or if Mixtral's DP2 rank 1 (finished
in session 5 from the kept checkpoint) stops being the measured resume of that checkpoint.
"""

from __future__ import annotations

import json
import tarfile
from pathlib import Path
from typing import Any

import pytest
from bundle_checks import checked_rows

from moetables.bundle import load_table, open_bundle, validate_bundle

ROOT = Path(__file__).resolve().parents[2]
QWEN15 = "Qwen/Qwen1.5-MoE-A2.7B"
MIXTRAL = "mistralai/Mixtral-8x7B-Instruct-v0.1"
MODULAR = ROOT / "bundles/H200-vllm-modular-f2"
LIVE = ROOT / "bundles/H200-vllm-live-f2"
# (bundle folder, deployments published, rows per deployment) as the calls returned them
SHIPPED = {
    (MODULAR, QWEN15): {
        "dp1_ep1_rank0_sp0": 68,
        "dp2_ep2_rank0_sp0": 587,
        "dp2_ep2_rank1_sp0": 587,
    },
    (LIVE, QWEN15): {"dp1_ep1_rank0_sp0": 81},
    (MODULAR, MIXTRAL): {
        "dp1_ep1_rank0_sp0": 49,
        "dp2_ep2_rank0_sp0": 334,
        "dp2_ep2_rank1_sp0": 334,  # session 5 call 6, resumed from the shipped checkpoint
    },
    (LIVE, MIXTRAL): {"dp1_ep1_rank0_sp0": 49},
}


@pytest.mark.parametrize("key", list(SHIPPED), ids=lambda k: f"{k[0].name}-{k[1]}")
def test_each_bundle_validates_with_the_deployments_and_rows_it_shipped(
    key: tuple[Path, str],
) -> None:
    """R38: checksums match; every published expert point passed its B/2B control (R18)."""
    folder, model = key
    root = folder / model / "bf16"
    report = validate_bundle(root)
    assert report.ok, report.problems
    bundle = open_bundle(root)
    assert bundle.hardware == "H200" and bundle.model == model
    assert checked_rows(bundle) == SHIPPED[key]


@pytest.mark.parametrize("key", list(SHIPPED), ids=lambda k: f"{k[0].name}-{k[1]}")
def test_the_samples_archive_beside_each_bundle_holds_the_checkpoint_and_logs(
    key: tuple[Path, str],
) -> None:
    """Issue 20: the raw samples stay with the bundle; no writer lock travels with them."""
    folder, model = key
    with tarfile.open(folder / model / "bf16.acquisition-samples.tar.gz") as tar:
        names = tar.getnames()
    assert {"progress.jsonl", "run.log", "phases.jsonl"} <= set(names)
    assert not [n for n in names if n.endswith(".lock")]
    samples = {n.split("/")[-2] for n in names if n.endswith("samples.jsonl")}
    assert set(SHIPPED[key]) <= samples


def _live_contract() -> dict[str, Any]:
    bundle = open_bundle(LIVE / QWEN15 / "bf16")
    contract: dict[str, Any] = bundle.entries[0].contract
    return contract


def test_qwen15_live_publishes_the_shared_expert_as_wrapper_rows() -> None:
    """Issue 20 item 2 (R26): the wrapper holds the shared expert, its sigmoid gate and the sum."""
    contract = _live_contract()
    shared = contract["backend"]["shared_experts"]
    assert (shared["measured"], shared["component"], shared["gate"]) == (True, "wrapper", "sigmoid")
    bundle = open_bundle(LIVE / QWEN15 / "bf16")
    table = load_table(bundle.root, bundle.entries[0])
    wrapper = sorted(
        int(n) for c, n in zip(table.component, table.tokens, strict=True) if c == "wrapper"
    )
    assert wrapper == [1, 2, 4, 8, 16, 32, 64, 128, 256, 257, 512, 1024, 2048]
    modular = open_bundle(MODULAR / QWEN15 / "bf16")
    for entry in modular.entries:  # the routed path only, and its contract says so
        assert entry.contract["backend"]["shared_experts"]["measured"] is False
        assert "wrapper" not in set(load_table(modular.root, entry).component)


def test_qwen15_live_ownership_traces_show_the_side_stream_only_up_to_256_tokens() -> None:
    """vLLM 0.26.0 runs the shared expert on a side stream up to 256 tokens
    (VLLM_SHARED_EXPERTS_STREAM_TOKEN_THRESHOLD); every traced activity has one owner."""
    traces = {t["tokens"]: t for t in _live_contract()["backend"]["launch_ownership"]}
    assert sorted(traces) == [1, 256, 2048]
    for n, trace in traces.items():
        assert trace["outside_scopes_us"] == 0.0
        parts = trace["gate_routing_us"] + trace["experts_us"] + trace["wrapper_us"]
        assert parts == pytest.approx(trace["native_forward_total_us"], rel=1e-6)
        wrapper = " ".join(trace["activities"]["wrapper"])
        assert "sigmoid" in wrapper and "CUDAFunctor_add" in wrapper and "act_and_mul" in wrapper
        streams = trace["streams"]
        assert len(streams["experts"]) == 1
        assert len(streams["parent"]) == (2 if n <= 256 else 1)
        assert set(streams["experts"]) <= set(streams["parent"])


def test_mixtral_dp2_rank1_is_the_resumed_checkpoint_and_its_bimodal_point_passed_late() -> None:
    """Rank 1's open point (experts:512:2:4) failed six controls in two processes (calls 11-12);
    session 5's resume measured it again in a third and it passed at its eighth attempt. The
    table holds exactly what that control selected, and the transplant is recorded."""
    bundle = open_bundle(MODULAR / MIXTRAL / "bf16")
    assert {e.target.rank for e in bundle.entries if e.target.dp == 2} == {0, 1}
    moved = bundle.meta["transplanted"]
    assert [m["deployment"] for m in moved] == ["tp1/dp2_ep2_rank1_sp0"]
    entry = next(e for e in bundle.entries if e.target.dp == 2 and e.target.rank == 1)
    assert moved[0]["table_sha256"] == entry.table_sha256
    with tarfile.open(MODULAR / MIXTRAL / "bf16.acquisition-samples.tar.gz") as tar:
        member = next(m for m in tar.getmembers() if m.name.endswith("rank1_sp0/samples.jsonl"))
        handle = tar.extractfile(member)
        assert handle is not None
        records = [json.loads(line) for line in handle.read().decode().splitlines()]
    controls = [
        r for r in records if r.get("type") == "control" and r["point"] == "experts:512:2:4"
    ]
    assert [r["passed"] for r in controls] == [False] * 7 + [True]
    assert len({r["session"] for r in controls}) == 3
    status = {r["point"]: r for r in records if r.get("type") == "point"}
    assert status["experts:512:2:4"]["status"] == "measured"
    table = load_table(bundle.root, entry)
    at = (
        (table.component == "experts")
        & (table.tokens == 512)
        & (table.activated_experts == 2)
        & (table.local_assignments == 4)
    )
    assert table.time_us[at].tolist() == [controls[-1]["selected_us"]]


@pytest.mark.parametrize("model", [QWEN15, MIXTRAL])
def test_the_scripts_plan_is_the_plan_of_the_shipped_checkpoints(model: str) -> None:
    """scripts/h200_models.sh (kernel steps off) resumes these checkpoints: same plan identity,
    so Mixtral's rank 1 can be finished without re-measuring anything published."""
    from acquisition.cli import build_parser
    from acquisition.cli import prepare as prepare_command

    argv = [
        "slice", model, "--hardware", "H200", "--tp", "1", "--tp-refresh", "1", "--group", "moe",
        "--max-num-batched-tokens", "2048", "--max-num-seqs", "128", "--moe-grid-factor", "2",
        "--cudagraph-capture-sizes", "1,2,4,8,16,32,64,128,256", "--dp", "1,2",
        "--backend", "vllm-modular", "--out-root", "/nonexistent", "--moe-kernel-steps", "off",
    ]  # fmt: skip
    _, plans = prepare_command(build_parser().parse_args(argv), argv)
    planned = {p.target.deployment: p.sha256 for p in plans}
    bundle = open_bundle(MODULAR / model / "bf16")
    for entry in bundle.entries:
        shipped = entry.contract["expert_sampling"]["point_plan_sha256"]
        assert planned[entry.target.deployment] == shipped
    with tarfile.open(MODULAR / model / "bf16.acquisition-samples.tar.gz") as tar:
        for member in tar.getmembers():
            if member.name.endswith("samples.jsonl"):
                handle = tar.extractfile(member)
                assert handle is not None
                identity = json.loads(handle.readline())["identity"]
                assert planned[member.name.split("/")[-2]] == identity["point_plan_sha256"]
