"""TP2/DP1/EP2 ranks of ``vllm-modular`` on one GPU (issue 20 item 3; R1-R4, R21, R22, R44).

vLLM 0.26.0 with expert parallelism folds TP into EP (``FusedMoEParallelConfig.make``: TP2,
DP1 gives tp_size 1, ep_size 2): each rank holds whole experts (half of them, by the linear
expert map), gate-routes every row of the batch and runs its experts on every row; no
all-to-all runs (``use_all2all_kernels`` needs DP > 1 or SP), so the prepare/finalize is
``no_dp_ep`` as at DP1, and the runner all-reduces the partial layer output over TP. Qwen3-MoE
declares a sequence-parallel wrapper, but vLLM runs it SP only with DP > 1
(``use_sequence_parallel_moe``), so these ranks are not SP (R3). The all-reduce is in no table
(R44): the contract names it and the estimate charges it.

CPU only: the session runs on the fakes of ``vllm_fakes``; the plan of the device command uses
the real catalog entry.
"""

from __future__ import annotations

import dataclasses
import io
import json
from pathlib import Path
from typing import Any

import pytest
import torch
import vllm_fakes as fv
from tiny_moe import write_model

from acquisition.acquire import acquire_target
from acquisition.adapters import AdmissionReport
from acquisition.adapters.base import Admission
from acquisition.adapters.vllm_modular import NO_DP_EP
from acquisition.adapters.vllm_modular_backend import VllmModularBackend
from acquisition.catalog import MoeModel, resolve_model
from acquisition.cli import build_parser, prepare
from acquisition.progress import ProgressReporter
from acquisition.protocol.stimulus import routing_stimulus
from moetables.bundle import validate_bundle
from moetables.cli import main as moetables_main
from moetables.geometry import ExpertGeometry, MoeTarget, linear_expert_map

REPO = Path(__file__).resolve().parents[2]
TP2 = [MoeTarget.for_rank(2, 1, rank) for rank in (0, 1)]
CLUSTER = REPO / "tests/moetables/data/cluster-fixture.yaml"


@pytest.fixture
def model(tmp_path: Path) -> MoeModel:
    return resolve_model(str(write_model(tmp_path / "tiny", num_experts=8)))


def backend() -> VllmModularBackend:
    return VllmModularBackend(resolve=fv.resolver(fv.modular_namespace()), activities=fv.activities)


@pytest.mark.parametrize("target", TP2, ids=["rank0", "rank1"])
def test_a_tp2_rank_holds_whole_experts_and_runs_every_row_without_all_to_all(
    model: MoeModel, target: MoeTarget
) -> None:
    session = backend().build(model, target, fv.fake_runtime(), "float32")
    try:
        # R22: DP1's components and prepare/finalize, verified a no-op, at EP2.
        assert session.components == ("gate_routing", "experts")
        assert session.choice.prepare_kind == NO_DP_EP
        described = session.describe()
        assert "0 device activities" in described["local_execution"]["prepare"]
        # R1, R4: whole experts over EP = TP, never tensor-sharded; vLLM's linear map.
        parallel = described["moe_parallel_config"]
        assert parallel == {
            "tp_size": 1,
            "dp_size": 1,
            "ep_size": 2,
            "ep_rank": target.rank,
            "dp_rank": 0,
            "sp_size": 1,
        }
        assert session.local_experts == 4
        assert session.expert_map.tolist() == linear_expert_map(8, 2, target.rank)
        assert described["expert_layout"]["w13"]["shape"] == [4, 2 * 8, 16]  # full width 8
        # R2: no SP, so the experts see all N rows, remote choices included.
        geometry = ExpertGeometry.for_target(8, model.top_k, target)
        mapping = linear_expert_map(8, 2, target.rank)
        n = 6
        stim = routing_stimulus(geometry, mapping, n, 2, 5, seed=3)
        assert (stim.topk_ids.shape[0], int((torch.tensor(mapping)[stim.topk_ids] >= 0).sum())) == (
            n,
            5,
        )
        session.allocate_banks(2)
        prepared = session.prepare_experts(stim)
        out = session.run_experts(prepared, 1)
        assert out.shape == (n, 16) and out is prepared.output
        assert torch.equal(out, session.reference_experts(prepared))
        # R44: the TP all-reduce after the layer is named, and excluded from the tables.
        assert "all-reduce over TP" in described["boundaries"]["experts"]
        assert described["collectives"]["in_tables"] is False
        assert described["collectives"]["trace_kind"] == "dp1_modular"
        assert described["collectives"]["steps"] == [
            {
                "op": "all_reduce",
                "tensor": "layer_output",
                "scope": "tp",
                "groups": [[0, 1]],
                "row_bytes": 16 * 4,
            }
        ]
    finally:
        session.close()


def test_tp1_dp2_ranks_name_their_dispatch_and_combine_and_dp1_names_none(
    model: MoeModel,
) -> None:
    dp1 = backend().build(model, MoeTarget.for_rank(1, 1, 0), fv.fake_runtime(), "float32")
    try:
        assert dp1.describe()["collectives"]["steps"] == []
        assert "all-reduce" not in dp1.describe()["boundaries"]["experts"]
    finally:
        dp1.close()
    dp2 = backend().build(model, MoeTarget.for_rank(1, 2, 1), fv.fake_runtime(), "float32")
    try:
        steps = dp2.describe()["collectives"]["steps"]
        assert [(s["op"], s["tensor"]) for s in steps] == [
            ("all_gather", "hidden_states"),
            ("all_gather", "topk_weights"),
            ("all_gather", "topk_ids"),
            ("reduce_scatter", "expert_output"),
        ]
        assert {s["scope"] for s in steps} == {"dp"}
    finally:
        dp2.close()


def qwen3_tp2_args(out: Path, *extra: str) -> list[str]:
    return [
        "slice",
        "Qwen/Qwen3-30B-A3B-Instruct-2507",
        "--hardware",
        "H200",
        "--tp",
        "1,2",
        "--tp-refresh",
        "2",
        "--dp",
        "1",
        "--group",
        "moe",
        "--max-num-batched-tokens",
        "2048",
        "--max-num-seqs",
        "128",
        "--moe-rounds",
        "3",
        "--measurement-iterations",
        "3",
        "--moe-grid-factor",
        "2",
        "--cudagraph-capture-sizes",
        "1,2,4,8,16,32,64,128,256",
        "--backend",
        "vllm-modular",
        "--out-root",
        str(out),
        *extra,
    ]


def test_the_device_commands_plan_is_two_non_sp_ranks_of_64_whole_experts(
    tmp_path: Path,
) -> None:
    """The plan of scripts/h200_acquisition_speed.sh with TP=2 (docs/h200-runs.md): the
    catalog declares Qwen3-MoE's wrapper sequence-parallel, yet TP2/DP1 is not SP (R3)."""
    args = qwen3_tp2_args(tmp_path / "out", "--moe-kernel-steps", "off")
    request, plans = prepare(build_parser().parse_args(args), args)
    assert request.model.sequence_parallel is True
    assert [p.target for p in plans] == TP2
    for plan in plans:
        assert plan.components == ("gate_routing", "experts")
        geometry = ExpertGeometry.for_target(128, 8, plan.target)
        assert geometry.local_experts == 64
        experts = [p for p in plan.points if p.component == "experts"]
        # R2: local rows = expert rows (no gather, no SP): the same budget on both axes.
        assert max(p.tokens for p in experts) == 2048
        assert len(plan.points) == 572
    # Expert points at TP2 and DP2: same L, half the expert rows (the DP2 rank gathers 2x).
    dp2_args = [a if a != "1,2" else "1" for a in args]
    dp2_args[dp2_args.index("--tp-refresh") + 1] = "1"
    dp2_args[dp2_args.index("--dp") + 1] = "2"
    _, dp2_plans = prepare(build_parser().parse_args(dp2_args), dp2_args)
    assert max(p.tokens for p in dp2_plans[0].points if p.component == "experts") == 4096
    # bench/tp2_vs_dp2.py compares each TP2 rank with the shipped DP2 rank of the same
    # experts: most TP2 points are points of that table (the same rule, N <= 2048 of 4096).
    shipped = REPO / "bundles/H200-vllm-modular-f2/Qwen/Qwen3-30B-A3B-Instruct-2507/bf16"
    for plan in plans:
        path = shipped / f"tp1/moe_components/dp2_ep2_rank{plan.target.rank}_sp0/components.csv"
        rows = {tuple(line.split(",")[:5]) for line in path.read_text().splitlines()[1:]}
        ours = {
            (
                p.component,
                "eager",
                str(p.tokens),
                str(p.activated_experts),
                str(p.local_assignments),
            )
            for p in plan.points
        }
        assert len(ours & rows) == 503  # 13 gate_routing + 490 of the 559 expert points


def test_a_tp2_acquisition_publishes_both_ranks_and_the_estimate_adds_the_all_reduce(
    tmp_path: Path,
) -> None:
    """End to end on CPU: both ranks' tables in one bundle, then ``moetables estimate --tp 2
    --dp 1`` over it: two ranks of N rows each and one TP all-reduce (R44, R45)."""
    model_dir = write_model(tmp_path / "tiny", num_experts=8)
    out = tmp_path / "out"
    args = [
        "slice",
        str(model_dir),
        "--hardware",
        "CPU",
        "--tp",
        "1,2",
        "--tp-refresh",
        "2",
        "--dp",
        "1",
        "--max-num-seqs",
        "2",
        "--max-num-batched-tokens",
        "2",
        "--profile-batch",
        "64",
        "--moe-rounds",
        "1",
        "--measurement-iterations",
        "1",
        "--warmup-cycles",
        "0",
        "--backend",
        "vllm-modular",
        "--device",
        "cpu",
        "--cache-bytes",
        "1",
        "--quality-tolerance",
        "0.9",
        "--cudagraph-mode",
        "NONE",
        "--no-progress-bar",
        "--out-root",
        str(out),
    ]
    request, plans = prepare(build_parser().parse_args(args), args)
    assert [p.target for p in plans] == TP2
    chosen = backend()
    progress = ProgressReporter(None, bar=False, total=sum(len(p.points) for p in plans))
    # The fakes' CPU operators on a shared CI machine: one thread avoids oversubscription.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for plan in plans:
            # Admission needs CUDA; the build and the protocol run on CPU with the fakes.
            report = AdmissionReport(plan.target, chosen.name, (Admission.accept(chosen.name),))
            outcome = acquire_target(request, plan, chosen, fv.fake_runtime(), report, progress)
            assert outcome.published
    finally:
        torch.set_num_threads(threads)
        progress.close()
    folder = out / "CPU" / "test" / "tiny-moe" / "fp32"
    report = validate_bundle(folder)
    assert report.ok, report.problems
    assert report.bundle is not None
    entries = {e.target: e for e in report.bundle.entries}
    assert set(entries) == set(TP2)
    for target, entry in entries.items():
        assert entry.table_path == f"tp2/moe_components/{target.deployment}/components.csv"
        contract: dict[str, Any] = entry.contract
        assert contract["components"] == ["gate_routing", "experts"]
        steps = contract["backend"]["collectives"]["steps"]
        assert [(s["op"], s["groups"]) for s in steps] == [("all_reduce", [[0, 1]])]

    text = io.StringIO()
    argv = ["estimate", str(folder), "--tp", "2", "--dp", "1", "--tokens", "2"]
    assert moetables_main([*argv, "--cluster", str(CLUSTER)], out=text) == 0
    answer = json.loads(text.getvalue())
    assert answer["deployment"]["kind"] == "dp1_modular"
    assert [(r["tp_rank"], r["local_rows"], r["N"]) for r in answer["ranks"]] == [
        (0, 2, 2),
        (1, 2, 2),
    ]
    assert all(set(r["components"]) == {"gate_routing", "experts"} for r in answer["ranks"])
    [reduce] = answer["collectives"]
    assert (reduce["op"], reduce["ranks"], reduce["bytes"]) == ("all_reduce", [0, 1], 2 * 16 * 4)
    assert answer["layer_us"] == pytest.approx(max(r["end_us"] for r in answer["ranks"]))


def test_a_tp2_dp1_target_cannot_be_declared_sequence_parallel() -> None:
    """R2, R3: SP needs TP > 1 and DP > 1 in vLLM; a TP2/DP1 SP target is malformed."""
    with pytest.raises(ValueError, match="sequence_parallel"):
        MoeTarget(tp=2, dp=1, ep=2, rank=0, sequence_parallel=True)
    assert dataclasses.replace(TP2[1], rank=0) == TP2[0]


def test_the_analysis_compares_each_tp2_rank_with_the_dp2_rank_of_the_same_experts(
    tmp_path: Path,
) -> None:
    """bench/tp2_vs_dp2.py: rank r against rank r, only at points both tables hold."""
    from bench.tp2_vs_dp2 import compare
    from moetables.bundle import write_bundle
    from tests.moetables.conftest import HEADER, make_spec, raw_affine

    tp2, dp2 = tmp_path / "tp2", tmp_path / "dp2"
    write_bundle(
        tp2,
        HEADER,
        [
            make_spec(t, tokens=[1, 2, 4, 8], time_fn=lambda n, a, m: 1.1 * raw_affine(n, a, m))
            for t in TP2
        ],
    )
    write_bundle(dp2, HEADER, [make_spec(MoeTarget.for_rank(1, 2, r)) for r in (0, 1)])
    report = compare(tp2, dp2)
    assert [(line["rank"], line["component"]) for line in report] == [
        (0, "experts"),
        (0, "gate_routing"),
        (1, "experts"),
        (1, "gate_routing"),
    ]
    experts = report[0]
    # Every TP2 expert point up to N=8 is also a DP2 point (same L, same plan rule).
    assert 0 < experts["shared_points"] <= experts["tp2_points"]
    positive = [w for w in experts["worst"] if w["A"] > 0]
    assert positive and all(w["relative"] == pytest.approx(0.1) for w in positive)
    assert report[1]["median"] == pytest.approx(0.0)
