"""The block trace (R44) and the cluster link model (R45)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from moetables.bundle import open_bundle
from moetables.comm import (
    ClusterError,
    CollectiveStep,
    ComputeStep,
    TensorWidths,
    build_trace,
    collective_bytes,
    launch_runs,
    launch_transfer_us,
    load_cluster,
    parse_cluster,
    tensor_widths,
    transfer_us,
)
from moetables.errors import QueryError
from tests.moetables.conftest import SHARED

FIXTURE = Path(__file__).parent / "data" / "cluster-fixture.yaml"
H200 = Path(__file__).resolve().parents[2] / "bundles/H200/Qwen/Qwen3-30B-A3B-Instruct-2507/bf16"
WIDTHS = TensorWidths(hidden_states=4096, topk_weights=32, topk_ids=32, source="test")


def _names(trace: Any) -> list[str]:
    return [s.component if isinstance(s, ComputeStep) else s.name for s in trace.steps]


def test_it_orders_the_dp_ep_modular_block() -> None:
    """R44: gate/routing, three AllGathers, experts, ReduceScatter, finalize."""
    trace = build_trace(1, 2, False, ("gate_routing", "experts", "finalize_copy"), WIDTHS)
    assert trace.kind == "dp_ep_modular"
    assert _names(trace) == [
        "gate_routing",
        "all_gather[hidden_states]",
        "all_gather[topk_weights]",
        "all_gather[topk_ids]",
        "experts",
        "reduce_scatter[expert_output]",
        "finalize_copy",
    ]


@pytest.mark.parametrize(("sp", "op"), [(False, "all_reduce"), (True, "all_gather")])
def test_it_adds_the_wrappers_tp_collective(sp: bool, op: str) -> None:
    """R44: TP > 1 adds AllGather with sequence parallelism, AllReduce without."""
    trace = build_trace(2, 2, sp, ("gate_routing", "experts", "finalize_copy"), WIDTHS)
    last = trace.steps[-1]
    assert isinstance(last, CollectiveStep)
    assert (last.op, last.scope, last.groups) == (op, "tp", ((0, 1), (2, 3)))
    gather = trace.steps[1]
    assert isinstance(gather, CollectiveStep)
    # Dispatch runs over the DP group, or over all of EP when each rank holds a 1/TP slice.
    assert gather.groups == (((0, 1, 2, 3),) if sp else ((0, 2), (1, 3)))


def test_it_has_dp1_and_live_blocks_without_dp_collectives() -> None:
    """R44: DP1 AllReduce only when TP > 1; live TP1 has no collectives at all."""
    assert _names(build_trace(1, 1, False, ("gate_routing", "experts"), None)) == [
        "gate_routing",
        "experts",
    ]
    assert _names(build_trace(2, 1, False, ("gate_routing", "experts"), WIDTHS)) == [
        "gate_routing",
        "experts",
        "all_reduce[layer_output]",
    ]
    assert _names(build_trace(1, 1, False, ("gate_routing", "experts", "wrapper"), None)) == [
        "gate_routing",
        "experts",
        "wrapper",
    ]


def test_it_says_which_component_a_bundle_lacks() -> None:
    with pytest.raises(QueryError, match=r"\['finalize_copy'\] missing"):
        build_trace(1, 2, False, ("gate_routing", "experts"), WIDTHS)


def test_it_sizes_tensors_from_recorded_dtypes_in_both_layouts() -> None:
    """R44: widths from the contract: bf16 hidden 2048, top-8 float32 weights, int32 ids."""
    for root in (H200, SHARED):
        entry = next(e for e in open_bundle(root).entries if e.target.dp == 2)
        w = tensor_widths(entry)
        assert (w.hidden_states, w.topk_weights, w.topk_ids) == (4096, 32, 32)


def test_it_names_the_kernels_vllm_runs_for_equal_and_unequal_counts() -> None:
    """vLLM 0.26.0: equal counts -> AllGather/ReduceScatter; unequal -> grouped Broadcast/Reduce."""
    trace = build_trace(1, 2, False, ("gate_routing", "experts", "finalize_copy"), WIDTHS)
    gather, scatter = trace.steps[1], trace.steps[5]
    assert isinstance(gather, CollectiveStep) and isinstance(scatter, CollectiveStep)
    assert gather.kernels(True, 2) == ["ncclAllGather"]
    assert scatter.kernels(True, 2) == ["ncclReduceScatter"]
    assert gather.kernels(False, 2) == [
        "ncclGroupStart",
        "ncclBroadcast(root=0)",
        "ncclBroadcast(root=1)",
        "ncclGroupEnd",
    ]
    assert scatter.kernels(False, 2)[1:3] == ["ncclReduce(root=0)", "ncclReduce(root=1)"]
    rows = np.array([[4, 4], [3, 9]])
    size, shares, equal = collective_bytes(gather, (0, 1), rows)
    assert size.tolist() == [8 * 4096, 12 * 4096]
    assert shares.tolist() == [[4 * 4096, 4 * 4096], [3 * 4096, 9 * 4096]]
    assert equal.tolist() == [True, False]


def test_it_times_collectives_by_the_alpha_beta_model() -> None:
    """R45: t = alpha + factor(op, n) S / bw; unequal counts as concurrent single-root ops."""
    cluster = load_cluster(FIXTURE)
    trace = build_trace(1, 2, False, ("gate_routing", "experts", "finalize_copy"), WIDTHS)
    gather = trace.steps[1]
    assert isinstance(gather, CollectiveStep)
    rows = np.array([[4, 4], [3, 9]])
    size, shares, equal = collective_bytes(gather, (0, 1), rows)
    t = transfer_us(cluster, gather, (0, 1), size, shares, equal)
    # Ranks 0 and 1 share the fast link: all_gather alpha 10, 100 GB/s, factor 1/2.
    assert t[0] == pytest.approx(10.0 + 0.5 * 8 * 4096 / 100e3)
    # Unequal: two broadcasts (alpha 8, 80 GB/s) in one NCCL group: one alpha, every root's
    # share one after the other, group_op_us (0 in a version 1 file) for the second root.
    assert t[1] == pytest.approx(8.0 + 3 * 4096 / 80e3 + 9 * 4096 / 80e3)
    # An AllReduce over all four ranks: factor 2(n-1)/n; no group of fast links holds all four.
    assert cluster.time_us("all_reduce", (0, 1, 2, 3), 1e6) == pytest.approx(30.0 + 1.5 * 1e6 / 5e3)


def test_it_uses_the_slowest_link_a_collective_spans() -> None:
    cluster = load_cluster(FIXTURE)
    fast = cluster.time_us("all_gather", (2, 3), 1e6)
    spanning = cluster.time_us("all_gather", (1, 2), 1e6)
    assert fast == pytest.approx(10.0 + 0.5 * 1e6 / 100e3)
    assert spanning == pytest.approx(20.0 + 0.5 * 1e6 / 10e3)
    with pytest.raises(QueryError, match="puts rank 5 in no group"):
        cluster.time_us("all_gather", (3, 5), 1e6)


def _fixture() -> dict[str, Any]:
    return yaml.safe_load(FIXTURE.read_text())


@pytest.mark.parametrize(
    ("edit", "where", "words"),
    [
        (lambda c: c.update(schema="cluster"), "schema", "must be 'moe-cluster'"),
        (lambda c: c.update(version=3), "version", "only versions [1, 2]"),
        (
            lambda c: c["link_classes"]["fast"]["collectives"]["all_gather"].update(
                bandwidth_by_size=[[1, 2], [4, 5]]
            ),
            "all_gather.bandwidth_by_size",
            "needs version 2",
        ),
        (
            lambda c: (
                c.update(version=2),
                c["link_classes"]["fast"]["collectives"]["reduce"].update(
                    bandwidth_by_size=[[8, 1.0], [8, 2.0]]
                ),
            ),
            "reduce.bandwidth_by_size[1]",
            "increase strictly",
        ),
        (
            lambda c: (
                c.update(version=2),
                c["link_classes"]["fast"]["collectives"]["reduce"].update(
                    bandwidth_by_size=[[8, 1.0]]
                ),
            ),
            "reduce.bandwidth_by_size",
            "at least two",
        ),
        (
            lambda c: (
                c.update(version=2),
                c["link_classes"]["fast"]["collectives"]["reduce"].update(
                    bandwidth_by_size=[[8, 1.0], [16, -2]]
                ),
            ),
            "reduce.bandwidth_by_size[1] GBps",
            "must be positive",
        ),
        (lambda c: c["provenance"].pop("command"), "provenance", "missing ['command']"),
        (lambda c: c["provenance"].update(measured_at="30.11.2026"), "measured_at", "YYYY-MM-DD"),
        (
            lambda c: c["link_classes"]["fast"]["collectives"].pop("reduce"),
            "link_classes.fast.collectives",
            "missing ['reduce']",
        ),
        (
            lambda c: c["link_classes"]["fast"]["collectives"]["all_gather"].update(
                bus_bandwidth_GBps=0
            ),
            "all_gather.bus_bandwidth_GBps",
            "must be positive",
        ),
        (
            lambda c: c["link_classes"]["fast"]["collectives"]["broadcast"].update(alpha_us="ten"),
            "broadcast.alpha_us",
            "finite number",
        ),
        (lambda c: c["groups"][0].update(link="ib"), "groups[0].link", "unknown link class 'ib'"),
        (lambda c: c["groups"][1].update(ranks=[2, 2]), "groups[1].ranks", "lists a rank twice"),
        (lambda c: c.update(extra=1), "fixture", "unknown field(s) ['extra']"),
    ],
)
def test_it_refuses_a_malformed_cluster_naming_the_field(edit: Any, where: str, words: str) -> None:
    raw = _fixture()
    edit(raw)
    with pytest.raises(ClusterError) as caught:
        parse_cluster(raw, source="fixture")
    assert where in str(caught.value) and words in str(caught.value)


def test_it_reads_the_fixture_and_says_when_a_file_is_not_yaml(tmp_path: Path) -> None:
    cluster = load_cluster(FIXTURE)
    assert cluster.name == "fixture-2x2" and cluster.provenance["measured_at"] == "2026-11-30"
    bad = tmp_path / "c.yaml"
    bad.write_text("schema: [unclosed\n")
    with pytest.raises(ClusterError, match="not YAML"):
        load_cluster(bad)
    with pytest.raises(ClusterError, match="cannot read"):
        load_cluster(tmp_path / "absent.yaml")


SHIPPED_CLUSTERS = sorted((Path(__file__).resolve().parents[2] / "clusters").glob("*.yaml"))


@pytest.mark.parametrize("path", SHIPPED_CLUSTERS, ids=[p.name for p in SHIPPED_CLUSTERS])
def test_it_loads_every_shipped_cluster_description(path: Path) -> None:
    """A shipped description is valid, named as its file, and its provenance has a command."""
    cluster = load_cluster(path)
    assert cluster.name == path.stem
    assert cluster.provenance["command"].strip()


def test_it_launches_the_three_dispatch_gathers_as_one_kernel() -> None:
    """R44/R45: vLLM 0.26.0 dispatches hidden states, top-k weights and ids in one NCCL group
    (one kernel on two H200s): the trace keeps the three logical AllGathers, the time model
    charges one latency and the bytes of all three."""
    trace = build_trace(1, 2, False, ("gate_routing", "experts", "finalize_copy"), WIDTHS)
    assert [getattr(s, "launch", None) for s in trace.steps] == [
        None,
        "dispatch",
        "dispatch",
        "dispatch",
        None,
        "",
        None,
    ]
    runs = launch_runs(trace.steps)
    assert runs[1] == runs[2] == runs[3] == (1, 2, 3) and runs[5] == (5,) and runs[4] == (4,)
    cluster = load_cluster(FIXTURE)
    rows = np.array([[4, 4], [3, 9]])
    members = []
    for k in (1, 2, 3):
        step = trace.steps[k]
        assert isinstance(step, CollectiveStep)
        members.append((step, *collective_bytes(step, (0, 1), rows)))
    parts = launch_transfer_us(cluster, members, (0, 1))
    total = np.sum(parts, axis=0)
    row = 4096 + 32 + 32
    # Equal: one all_gather alpha (10) and factor 1/2 of every member's S at 100 GB/s.
    assert total[0] == pytest.approx(10.0 + 0.5 * 8 * row / 100e3)
    # Unequal: one broadcast alpha (8), both roots' rows of every tensor at 80 GB/s.
    assert total[1] == pytest.approx(8.0 + (3 + 9) * row / 80e3)
    # The latency sits on the first member; the others carry only their bytes.
    assert parts[1][0] == pytest.approx(0.5 * 8 * 32 / 100e3)
    alone = [transfer_us(cluster, m[0], (0, 1), *m[1:]) for m in members]
    assert np.sum(alone, axis=0)[0] == pytest.approx(total[0] + 2 * 10.0)


def test_it_charges_each_further_operation_of_a_launch_group_op_us() -> None:
    """R45 (format version 2): a grouped launch pays one latency, ``group_op_us`` per NCCL
    operation beyond the first, and every operation's bytes; unequal roots one after another."""
    raw = _fixture()
    raw["version"] = 2
    raw["link_classes"]["slow"]["group_op_us"] = 1.5
    cluster = parse_cluster(raw, source="v2")
    step = CollectiveStep("all_gather", "hidden_states", "dp", ((0, 1, 2, 3),), 1000)
    rows = np.array([[1, 2, 3, 10], [5, 5, 5, 5]])
    size, shares, equal = collective_bytes(step, (0, 1, 2, 3), rows)
    t = transfer_us(cluster, step, (0, 1, 2, 3), size, shares, equal)
    # Four ranks: only the slow class holds them (broadcast alpha 20, 10 GB/s; 4 roots).
    assert t[0] == pytest.approx(20.0 + 3 * 1.5 + 16 * 1000 / 10e3)
    # Equal counts: one AllGather (alpha 20, factor 3/4), a single operation.
    assert t[1] == pytest.approx(20.0 + 0.75 * 20 * 1000 / 10e3)
    # A launch of two equal-count gathers: one alpha, one further operation.
    other = CollectiveStep("all_gather", "topk_ids", "dp", ((0, 1, 2, 3),), 10, launch="x")
    first = CollectiveStep("all_gather", "hidden_states", "dp", ((0, 1, 2, 3),), 1000, launch="x")
    members = [(m, *collective_bytes(m, (0, 1, 2, 3), rows[1:])) for m in (first, other)]
    parts = launch_transfer_us(cluster, members, (0, 1, 2, 3))
    assert parts[0][0] == pytest.approx(20.0 + 1.5 + 0.75 * 20 * 1000 / 10e3)
    assert parts[1][0] == pytest.approx(0.75 * 20 * 10 / 10e3)
    raw["version"] = 1
    with pytest.raises(ClusterError, match="group_op_us: needs version 2"):
        parse_cluster(raw, source="v1")


def test_it_reads_a_bandwidth_by_size_table_in_log_size() -> None:
    """R45 (format version 2): the bus bandwidth follows a short table of (S, GB/s) points,
    linear in log2(S) between them and the nearest point's outside; version 1 still loads."""
    raw = _fixture()
    raw["version"] = 2
    raw["link_classes"]["fast"]["collectives"]["all_gather"]["bandwidth_by_size"] = [
        [1 << 20, 50.0],
        [4 << 20, 150.0],
    ]
    cluster = parse_cluster(raw, source="v2")
    fast = cluster.link_classes["fast"].collectives["all_gather"]
    assert fast.bandwidth_GBps([1 << 10, 1 << 20, 2 << 20, 4 << 20, 1 << 30]).tolist() == [
        50.0,
        50.0,
        100.0,
        150.0,
        150.0,
    ]
    assert cluster.time_us("all_gather", (0, 1), 2 << 20) == pytest.approx(
        10.0 + 0.5 * (2 << 20) / 100e3
    )
    # Ops without a table keep their single bandwidth.
    assert cluster.time_us("reduce_scatter", (0, 1), 2 << 20) == pytest.approx(
        12.0 + 0.5 * (2 << 20) / 100e3
    )
    assert (
        load_cluster(FIXTURE).link_classes["fast"].collectives["all_gather"].bandwidth_by_size == ()
    )
