"""The MoE layer estimate: routing + components + collectives + the worst rank (R41, R44, R45).

The synthetic bundle's times come from the formulas in conftest (affine in raw N/A/M, so the
triangulation reproduces them exactly), and the cluster is the hand-written test fixture: every
expected number below is computed by hand from those formulas.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from moetables import ComponentTables
from moetables.bundle import write_bundle
from moetables.comm import load_cluster
from moetables.errors import CoverageError, QueryError
from moetables.estimate import pad_to_capture
from moetables.geometry import MoeTarget
from tests.moetables.conftest import HEADER, SHARED, make_spec, raw_affine

FIXTURE = Path(__file__).parent / "data" / "cluster-fixture.yaml"
H200 = Path(__file__).resolve().parents[2] / "bundles/H200/Qwen/Qwen3-30B-A3B-Instruct-2507/bf16"
HIDDEN = 64  # bf16 -> 128 bytes per row; top-4 float32 weights and int32 ids -> 16 bytes each


def _spec(target: MoeTarget, **kw: object):  # type: ignore[no-untyped-def]
    spec = make_spec(target, **kw)  # type: ignore[arg-type]
    spec.contract.update(
        hidden_dim=HIDDEN,
        input_dtype="bfloat16",
        topk_weights_dtype="float32",
        topk_ids_dtype="int32",
    )
    return spec


@pytest.fixture
def bundle(tmp_path: Path) -> Path:
    dest = tmp_path / "bundle"
    specs = [_spec(MoeTarget.for_rank(1, 2, r)) for r in (0, 1)]
    specs.append(_spec(MoeTarget.for_rank(1, 1, 0)))
    write_bundle(dest, HEADER, specs)
    return dest


def gate(n: int) -> float:
    return 2.0 + 0.01 * n


def finalize(n: int) -> float:
    return 0.5 + 0.001 * n


def test_it_splits_each_ranks_time_into_compute_wait_and_transfer(bundle: Path) -> None:
    """R45: the early rank waits for the last; transfers come from the link model."""
    cluster = load_cluster(FIXTURE)
    est = ComponentTables(bundle).estimate([4, 16], tp=1, dp=2, cluster=cluster)
    n, k, e, local = 20, 4, 16, 8
    m = -(-n * k * local // e)  # ceil(N k L / E) = 40
    a = min(local, m)
    expert = raw_affine(n, a, m)
    r0, r1 = est.ranks
    assert (r0.local_rows, r0.N, r0.A, r0.M) == (4, n, a, m)
    assert r0.components == pytest.approx(
        {"gate_routing": gate(4), "experts": expert, "finalize_copy": finalize(4)}
    )
    assert r0.compute_us == pytest.approx(gate(4) + expert + finalize(4))
    # Unequal counts: the three AllGathers are one NCCL group of broadcasts (alpha 8, 80 GB/s),
    # one launch (R44/R45): one alpha, charged on the first member, and both roots' rows of
    # each tensor (group_op_us is 0 in the version 1 fixture).
    parts = [8.0 + 20 * 128 / 80e3, 20 * 16 / 80e3, 20 * 16 / 80e3]
    gathers = sum(parts)
    scatter = 9.0 + 20 * 2 * HIDDEN / 80e3  # a group of two reduces, one alpha
    assert [c.transfer_us for c in est.collectives] == pytest.approx([*parts, scatter])
    assert [c.launch for c in est.collectives] == ["dispatch"] * 3 + [""]
    # Rank 0 reaches the first AllGather gate(16) - gate(4) earlier; then both are in step
    # (equal N, A, M: equal expert times), and nothing waits for the finalize copies.
    assert r0.wait_us == pytest.approx(gate(16) - gate(4))
    assert r1.wait_us == pytest.approx(0.0)
    assert r0.transfer_us == r1.transfer_us == pytest.approx(gathers + scatter)
    layer = gate(16) + gathers + expert + scatter + finalize(16)
    assert est.layer_us == pytest.approx(layer)
    assert est.layer_compute_us == pytest.approx(gate(16) + expert + finalize(16))
    assert est.critical_rank == 1
    gather = est.collectives[0]
    assert (gather.op, gather.bytes, gather.bytes_by_rank) == ("all_gather", 20 * 128, (512, 2048))
    assert gather.vllm_call.startswith("all_gatherv") and not gather.equal_counts
    assert gather.wait_us == pytest.approx(gate(16) - gate(4))


def test_it_runs_equal_counts_as_one_allgather_and_reducescatter(bundle: Path) -> None:
    cluster = load_cluster(FIXTURE)
    est = ComponentTables(bundle).estimate([8, 8], tp=1, dp=2, cluster=cluster)
    assert [c.kernels for c in est.collectives] == [("ncclAllGather",)] * 3 + [
        ("ncclReduceScatter",)
    ]
    hidden = est.collectives[0]
    assert hidden.transfer_us == pytest.approx(10.0 + 0.5 * 16 * 128 / 100e3)
    assert est.ranks[0].wait_us == est.ranks[1].wait_us == 0.0


def test_it_reports_bytes_but_no_transfer_time_without_a_cluster(bundle: Path) -> None:
    """Never a made-up number: transfers and the layer time stay null, flagged in notes."""
    est = ComponentTables(bundle).estimate([4, 16], tp=1, dp=2)
    assert est.layer_us is None and est.cluster is None
    assert all(c.transfer_us is None and c.bytes > 0 for c in est.collectives)
    assert all(r.transfer_us is None for r in est.ranks)
    assert est.layer_compute_us == pytest.approx(gate(16) + raw_affine(20, 8, 40) + finalize(16))
    assert any("no cluster given" in note for note in est.notes)
    answer = est.as_dict()
    assert answer["layer_us"] is None and answer["collectives"][0]["transfer_us"] is None


def test_it_has_no_collectives_at_dp1(bundle: Path) -> None:
    est = ComponentTables(bundle).estimate([10], tp=1, dp=1)
    assert est.kind == "dp1_modular" and est.collectives == ()
    (r,) = est.ranks
    assert r.M == 10 * 4  # EP1: M = N k
    assert est.layer_compute_us == pytest.approx(gate(10) + raw_affine(10, 16, 40))
    # With nothing to transfer the layer time is known without a cluster.
    assert est.layer_us is None or est.layer_us == pytest.approx(est.layer_compute_us)


def test_it_names_rank_and_component_when_a_step_leaves_support(bundle: Path) -> None:
    """Never extrapolate: N = 80 gathered rows is past the measured 64."""
    tables = ComponentTables(bundle)
    with pytest.raises(CoverageError, match=r"rank 0 experts at N=80 A=8 M=160"):
        tables.estimate([40, 40], tp=1, dp=2)
    with pytest.raises(CoverageError, match=r"rank 1 gate_routing at rows=65"):
        tables.estimate([1, 65], tp=1, dp=1 + 1, policy="round_robin")


def test_it_refuses_what_it_cannot_estimate(bundle: Path, tmp_path: Path) -> None:
    tables = ComponentTables(bundle)
    with pytest.raises(QueryError, match="unknown routing policy 'zipf'"):
        tables.estimate([4, 4], tp=1, dp=2, policy="zipf")
    with pytest.raises(QueryError, match="mode must be one of"):
        tables.estimate([4, 4], tp=1, dp=2, mode="replay")
    with pytest.raises(QueryError, match="graph mode needs the serving capture sizes"):
        tables.estimate([4, 4], tp=1, dp=2, mode="graph")
    with pytest.raises(CoverageError, match="no table for TP2/DP2"):
        tables.estimate([4, 4], tp=2, dp=2)
    lone = tmp_path / "lone"
    write_bundle(lone, HEADER, [_spec(MoeTarget.for_rank(1, 2, 0))])
    with pytest.raises(CoverageError, match="needs every rank's table; rank 1"):
        ComponentTables(lone).estimate([4, 4], tp=1, dp=2)


def test_it_refuses_a_contract_without_dtypes_for_the_collectives(tmp_path: Path) -> None:
    dest = tmp_path / "nodtype"
    write_bundle(dest, HEADER, [make_spec(MoeTarget.for_rank(1, 2, r)) for r in (0, 1)])
    with pytest.raises(QueryError, match="records no hidden size"):
        ComponentTables(dest).estimate([4, 4], tp=1, dp=2)


def test_it_estimates_a_batch_as_its_single_steps(bundle: Path) -> None:
    cluster = load_cluster(FIXTURE)
    tables = ComponentTables(bundle)
    steps = np.array([[4, 16], [8, 8], [1, 30], [30, 2]])
    for policy in ("balanced", "round_robin", "random"):
        batch = tables.estimate_batch(steps, tp=1, dp=2, policy=policy, cluster=cluster, seed=3)
        assert batch.layer_us is not None
        # Step i of a random batch draws from the stream (seed, i); a single step is step 0.
        rows = steps.tolist()[:1] if policy == "random" else steps.tolist()
        for i, row in enumerate(rows):
            one = tables.estimate(row, tp=1, dp=2, policy=policy, cluster=cluster, seed=3)
            assert batch.layer_us[i] == pytest.approx(one.layer_us)
            assert batch.wait_us[i].tolist() == pytest.approx([r.wait_us for r in one.ranks])


def test_it_marks_refused_steps_in_a_batch_and_answers_the_rest(bundle: Path) -> None:
    batch = ComponentTables(bundle).estimate_batch([[4, 4], [40, 40], [2, 3]], tp=1, dp=2)
    assert batch.code.tolist() == [0, 1, 0]
    assert "rank 0 experts" in batch.errors[1]
    assert np.isnan(batch.layer_compute_us[1]) and not np.isnan(batch.layer_compute_us[2])
    answers = batch.as_dicts()
    assert answers[1]["error"] == "out_of_support" and "layer_compute_us" in answers[2]


def test_it_estimates_through_a_deployment_rank_too(bundle: Path) -> None:
    tables = ComponentTables(bundle)
    via_rank = tables.deployment(1, 2, 1).estimate([4, 16], policy="round_robin")
    assert via_rank == tables.estimate([4, 16], tp=1, dp=2, policy="round_robin")


def test_it_pads_graph_steps_to_the_next_capture_size_as_vllm_does() -> None:
    assert pad_to_capture([3], [1, 2, 4, 8]) == ([4], True)
    # With DP every rank runs the largest padded size of the step.
    assert pad_to_capture([3, 5], [1, 2, 4, 8]) == ([8, 8], True)
    # Past the largest capture size the step runs eagerly, unpadded.
    assert pad_to_capture([3, 9], [1, 2, 4, 8]) == ([3, 9], False)


def test_it_estimates_graph_mode_at_padded_rows(bundle: Path) -> None:
    tables = ComponentTables(bundle)
    est = tables.estimate([3, 5], tp=1, dp=2, mode="graph", capture_sizes=[1, 2, 4, 8, 16])
    assert est.padded_tokens == (8, 8) and est.tokens == (3, 5)
    assert est.table_mode == "eager"  # new tables are eager; read at the padded rows
    assert est.ranks[0].local_rows == 8 and est.ranks[0].N == 16


def test_it_estimates_the_shipped_h200_dp2_layer() -> None:
    """The real H200 bundle: bf16 hidden 2048 -> 4096 bytes a row, unequal counts."""
    est = ComponentTables(H200).estimate([5, 300], tp=1, dp=2)
    assert est.kind == "dp_ep_modular"
    assert est.collectives[0].bytes == 305 * 4096
    assert [r.N for r in est.ranks] == [305, 305]
    assert all(set(r.components) == {"gate_routing", "experts", "finalize_copy"} for r in est.ranks)


def test_it_keeps_historical_tables_to_balanced_routing() -> None:
    """R42: the LLMServingSim tables answer balanced queries only; others are refused."""
    tables = ComponentTables(SHARED)
    est = tables.estimate([64, 64], tp=1, dp=2)
    assert est.ranks[0].M == 64 * 2 * 8 // 2
    # Round robin over N = 127 rows deals rank 0 512 pairs, not the balanced 508.
    with pytest.raises(
        CoverageError,
        match=r"rank 0 experts at N=127 A=64 M=512: .* balanced assignment totals only",
    ):
        tables.estimate([64, 63], tp=1, dp=2, policy="round_robin")


def test_it_answers_a_batch_exactly_as_its_steps_answer_one_by_one(bundle: Path) -> None:
    """The fast many-step answer is the single-step answer, refusals and all."""
    cluster = load_cluster(FIXTURE)
    batch = ComponentTables(bundle).estimate_batch(
        [[4, 16], [40, 40], [1, 30]], tp=1, dp=2, cluster=cluster, policy="random", seed=5
    )
    answers = batch.as_dicts()
    assert answers[0] == batch.step(0).as_dict() and answers[2] == batch.step(2).as_dict()
    assert answers[1] == {"error": "out_of_support", "message": batch.errors[1]}
    lean = batch.as_dicts(events=False)
    assert "events" not in lean[0] and {**lean[0], "events": answers[0]["events"]} == answers[0]


@pytest.mark.parametrize("sp", [False, True])
def test_it_runs_tp2_dp2_collectives_over_their_groups_and_links(tmp_path: Path, sp: bool) -> None:
    """R44: TP > 1 dispatches over the DP group (or all of EP with SP) and adds the wrapper's
    TP collective; R45: a DP group spanning both fast pairs is timed on the slow link."""
    dest = tmp_path / f"tp2-sp{int(sp)}"
    write_bundle(dest, HEADER, [_spec(MoeTarget.for_rank(2, 2, r, sp)) for r in range(4)])
    cluster = load_cluster(FIXTURE)
    est = ComponentTables(dest).estimate([5, 8], tp=2, dp=2, sequence_parallel=sp, cluster=cluster)
    ops = [(c.op, c.tensor, c.ranks) for c in est.collectives]
    if not sp:
        assert [r.local_rows for r in est.ranks] == [5, 5, 8, 8]
        assert {r.N for r in est.ranks} == {13}
        assert ops[:2] == [
            ("all_gather", "hidden_states", (0, 2)),
            ("all_gather", "hidden_states", (1, 3)),
        ]
        assert ops[-2:] == [
            ("all_reduce", "layer_output", (0, 1)),
            ("all_reduce", "layer_output", (2, 3)),
        ]
        gather = est.collectives[0]  # ranks 0 and 2: only the slow group holds both
        # Grouped roots: one broadcast alpha, both roots' shares.
        assert gather.transfer_us == pytest.approx(20 + (5 + 8) * 128 / 10e3)
        reduce = est.collectives[-2]  # ranks 0 and 1 share a fast pair: 2(n-1)/n = 1
        assert reduce.transfer_us == pytest.approx(15.0 + 1.0 * 5 * 128 / 50e3)
    else:
        assert [r.local_rows for r in est.ranks] == [3, 3, 4, 4]
        assert {r.N for r in est.ranks} == {2 * (3 + 4)}
        assert ops[0] == ("all_gather", "hidden_states", (0, 1, 2, 3))
        assert est.collectives[0].bytes_by_rank == (384, 384, 512, 512)
        assert ops[-2:] == [
            ("all_gather", "layer_output", (0, 1)),
            ("all_gather", "layer_output", (2, 3)),
        ]
    assert sum(r.M for r in est.ranks) >= est.ranks[0].N * 4
    assert est.layer_us == pytest.approx(max(r.end_us for r in est.ranks))


def test_it_reads_graph_tables_for_graph_steps_and_eager_ones_past_the_captures() -> None:
    """Historical tables hold graph rows: a padded step reads them; a step past the largest
    capture size runs eagerly and reads the eager rows, also inside one batch."""
    tables = ComponentTables(SHARED)
    sizes = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512]
    graph = tables.estimate([3, 50], tp=1, dp=2, mode="graph", capture_sizes=sizes)
    assert (graph.table_mode, graph.padded_tokens) == ("graph", (64, 64))
    assert graph.ranks[0].components["gate_routing"] == pytest.approx(
        tables.deployment(1, 2, 0).time_us("gate_routing", 64, mode="graph")
    )
    past = tables.estimate([3, 1000], tp=1, dp=2, mode="graph", capture_sizes=sizes)
    eager = tables.estimate([3, 1000], tp=1, dp=2)
    assert past.table_mode == "eager" and past.ranks == eager.ranks
    assert any("runs eagerly" in note for note in past.notes)
    batch = tables.estimate_batch(
        [[3, 50]] * 6 + [[3, 1000]] * 6, tp=1, dp=2, mode="graph", capture_sizes=sizes
    )
    answers = batch.as_dicts()
    assert answers[0] == graph.as_dict() and answers[-1] == past.as_dict()


def test_a_table_without_its_models_shared_expert_says_so_in_every_answer(
    tmp_path: Path,
) -> None:
    """Issue 20 item 2: a modular table of a shared-expert model (Qwen1.5-MoE) times the routed
    path only; its contract says so, and so does every layer estimate read from it."""
    unmeasured = _spec(MoeTarget.for_rank(1, 1, 0))
    unmeasured.contract["backend"] = {
        "name": "vllm-modular",
        "shared_experts": {"count": 1, "intermediate_size": 5632, "gate": "sigmoid",
                           "measured": False, "component": None},
    }  # fmt: skip
    measured = _spec(MoeTarget.for_rank(1, 1, 0))
    measured.contract["backend"] = {"shared_experts": {"measured": True, "component": "wrapper"}}
    answers = []
    for name, spec in (("unmeasured", unmeasured), ("measured", measured)):
        write_bundle(tmp_path / name, HEADER, [spec])
        answers.append(ComponentTables(tmp_path / name).estimate([16], tp=1, dp=1))
    (note,) = [n for n in answers[0].notes if "shared expert" in n]
    assert "width 5632" in note and "leaves it out" in note
    assert not any("shared expert" in n for n in answers[1].notes)
    batch = ComponentTables(tmp_path / "unmeasured").estimate_batch([[4], [8]], tp=1, dp=1)
    assert all(note in step.notes for step in (batch.step(0), batch.step(1)))
