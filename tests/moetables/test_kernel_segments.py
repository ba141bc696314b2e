"""Kernel-step tables answer each query from its own Triton kernel segment in N (R40: at most
four measured vertices, exact rows verbatim, no extrapolation, here never across a switch of
vLLM's configuration); every other table answers bit for bit as before (R40, R42); a record
that contradicts its table is a corrupt contract (R43)."""

from __future__ import annotations

import copy
import json
from functools import cache
from pathlib import Path

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from acquisition.plan.kernel import KernelSteps
from moetables.bundle import load_table, open_bundle
from moetables.errors import BundleError, CoverageError
from moetables.lookup import OK, OUT_OF_SUPPORT, ComponentTables, DeploymentTables
from moetables.lookup.balanced import BalancedExpertSurface
from moetables.lookup.explain import explain_expert
from moetables.lookup.segments import SegmentedExpertSurface, contract_kernel_switches
from moetables.lookup.surface import ExpertSurface
from tests.json_close import json_close
from tests.moetables import lookup_sample

REPO = Path(__file__).resolve().parents[2]
QWEN = "Qwen/Qwen3-30B-A3B-Instruct-2507/bf16"
F2K = {
    "modular": REPO / "bundles/H200-vllm-modular-f2k" / QWEN,
    "live": REPO / "bundles/H200-vllm-live-f2k" / QWEN,
}
F2K_TARGETS = [("modular", 1, 0), ("modular", 2, 0), ("modular", 2, 1), ("live", 1, 0)]
# Every shipped table whose contract records a kernel-step rule (v2: f2k; v4: f2k4, TP1/DP1).
KERNEL_STEP_ROOTS = {
    *F2K.values(),
    REPO / "bundles/H200-vllm-modular-f2k4" / QWEN,
    REPO / "bundles/H200-vllm-live-f2k4" / QWEN,
    # session 12: the catalog models' DP1 tables on rule v4 (their -dp2-f4/-dp4-f4/-dp8-f4 rank
    # tables have no steps); session 13 added rule-v4 DP2/EP2 ranks to the OLMoE and DeepSeek ones
    REPO / "bundles/H200-vllm-modular-f2k4/Qwen/Qwen3-235B-A22B/bf16",
    REPO / "bundles/H200-vllm-modular-f2k4/deepseek-ai/DeepSeek-V2-Lite/bf16",
    REPO / "bundles/H200-vllm-modular-f2k4/allenai/OLMoE-1B-7B-0924/bf16",
    REPO / "bundles/H200-vllm-live-f2k4/allenai/OLMoE-1B-7B-0924/bf16",
    # session 15: FP8 on rule v4 (TP1/DP1 and DP2/EP2 ranks, live TP1); Qwen3-235B's DP4/EP4
    # ranks joined its DP1 table above
    REPO / "bundles/H200-vllm-modular-f2k4/Qwen/Qwen3-30B-A3B-Instruct-2507-FP8/fp8",
    REPO / "bundles/H200-vllm-live-f2k4/Qwen/Qwen3-30B-A3B-Instruct-2507-FP8/fp8",
}
PLAIN = REPO / "bundles/H200-vllm-modular-f2" / QWEN  # factor 2, no kernel-step record
VALUES = Path(__file__).parent / "data" / "lookup_sample_values.json"


@cache
def deployment(kind: str, dp: int, rank: int) -> DeploymentTables:
    return ComponentTables(F2K[kind]).deployment(1, dp, rank)


@cache
def plain(dp: int, rank: int) -> DeploymentTables:
    return ComponentTables(PLAIN).deployment(1, dp, rank)


@cache
def positive_points(d: DeploymentTables) -> tuple[np.ndarray, ...]:
    table = load_table(d.root, d.entry)
    rows = table.select("experts", "eager")
    n, a, m, t = (
        table.tokens[rows],
        table.activated_experts[rows],
        table.local_assignments[rows],
        table.time_us[rows],
    )
    keep = ~((a == 0) & (m == 0))
    return n[keep], a[keep], m[keep], t[keep]


def planner_steps(d: DeploymentTables) -> KernelSteps:
    """The planner's rule for this table's target, built as the acquisition builds it."""
    g = d.entry.geometry
    return KernelSteps.for_target(
        hardware=str(d.entry.contract["hardware"]),
        dtype="bf16",
        local_experts=g.local_experts,
        global_experts=g.global_experts,
        top_k=g.top_k,
        width=768,
    )


@cache
def own_segment_surface(kind: str, dp: int, rank: int, first: int) -> ExpertSurface | None:
    """What the query's own segment alone answers: a surface over the points of the run of N
    around ``first`` that the planner's rule serves with one kernel, built here independently
    of the lookup. A run, not every N of that kernel: at DP1 one configuration recurs after
    another (two segments, one kernel), and interpolating between them would cross two switches."""
    d = deployment(kind, dp, rank)
    steps = planner_steps(d)
    n, a, m, t = positive_points(d)
    kernel = steps.kernel(first)
    lo = first
    while lo > 1 and steps.kernel(lo - 1) == kernel:
        lo -= 1
    hi = first
    while hi <= int(n.max()) and steps.kernel(hi + 1) == kernel:
        hi += 1
    same = (n >= lo) & (n <= hi)
    if not same.any():
        return None
    return ExpertSurface(n[same], a[same], m[same], t[same], d.entry.geometry, label="own")


# -- every other table: bit for bit ------------------------------------------------------


def test_every_table_answers_the_committed_sample() -> None:  # R40, R42
    """Over every shipped bundle, a fixed sample of batch and scalar lookups per table and mode
    gives the committed answers: the same refusals and codes, the same times up to the last
    bits of a float. Every table but the kernel-step ones answered these values before
    kernel segments existed (checked bit for bit against commit 704c221 when they were added);
    the rule-v4 tables' values were added when they were shipped (session 6), and the
    session-12 models' tables (Qwen3-235B-A22B, DeepSeek-V2-Lite, OLMoE) when they were."""
    committed = json.loads(VALUES.read_text())
    now = lookup_sample.answers()
    assert set(now) == set(committed)
    for key, got in now.items():
        want = committed[key]
        assert got["code"] == want["code"], key
        assert [x is None for x in got["batch"]] == [x is None for x in want["batch"]], key
        assert json_close(got["batch"], want["batch"]), key
        assert [isinstance(x, str) for x in got["scalar"]] == [
            isinstance(x, str) for x in want["scalar"]
        ], key
        assert json_close(got["scalar"], want["scalar"]), key


def test_only_kernel_step_contracts_record_kernel_steps() -> None:
    for root in lookup_sample.bundle_roots():
        for entry in open_bundle(root).entries:
            recorded = "kernel_steps" in (entry.contract.get("expert_sampling") or {})
            assert recorded == (root in KERNEL_STEP_ROOTS), root


def test_only_kernel_step_tables_get_segments() -> None:
    for root in lookup_sample.bundle_roots():
        tables = ComponentTables(root)
        for entry in tables.bundle.entries:
            t = entry.target
            d = tables.deployment(t.tp, t.dp, t.rank, t.sequence_parallel)
            surface = d._experts[("experts", "eager")]
            if root in KERNEL_STEP_ROOTS:
                assert type(surface) is SegmentedExpertSurface
            else:
                assert type(surface) in (ExpertSurface, BalancedExpertSurface)
                assert d.kernel_switches is None


@settings(max_examples=150, deadline=None)
@given(
    dp=st.sampled_from([1, 2]),
    n=st.integers(1, 5000),
    a_frac=st.floats(0, 1),
    m_frac=st.floats(0, 1),
)
def test_a_table_without_kernel_steps_is_one_triangulation(
    dp: int, n: int, a_frac: float, m_frac: float
) -> None:  # R40
    """The factor-2 tables (no record) answer as one `ExpertSurface` over all their points."""
    d = plain(dp, 0)
    g = d.entry.geometry
    a = max(1, round(a_frac * g.local_experts))
    low, high = g.assignment_bounds(n, a)
    m = low + round(m_frac * (high - low))
    table = load_table(d.root, d.entry)
    rows = table.select("experts", "eager")
    whole = ExpertSurface(
        table.tokens[rows],
        table.activated_experts[rows],
        table.local_assignments[rows],
        table.time_us[rows],
        g,
        label="whole",
    )
    q = (np.array([n]), np.array([a]), np.array([m]))
    got, want = d.batch("experts", *q), whole.batch(*q)
    assert np.array_equal(got.time_us, want[0], equal_nan=True)
    assert np.array_equal(got.code, want[1])


# -- plan and lookup agree -----------------------------------------------------------------


@pytest.mark.parametrize("target", F2K_TARGETS)
def test_the_planned_switch_rows_are_exactly_the_segment_boundaries(
    target: tuple[str, int, int],
) -> None:
    """The planner's rule and the lookup's segments are one definition, and every switch the
    plan measured (t and t + 1) sits on a segment boundary of the shipped table."""
    d = deployment(*target)
    surface = d._experts[("experts", "eager")]
    assert isinstance(surface, SegmentedExpertSurface)
    steps = planner_steps(d)
    assert d.kernel_switches == steps.switches_rule
    n, _, _, _ = positive_points(d)
    top = int(n.max())
    measured = set(n.tolist())
    planned = set(steps.row_steps(top))
    record = d.entry.contract["expert_sampling"]["kernel_steps"]
    assert set(record["expert_rows_added"]) <= planned | set(
        steps.row_corners(top, range(1, d.entry.geometry.local_experts + 1))
    )
    boundaries = {s.first for s in surface.segments[1:]} | {
        s.last for s in surface.segments if s.last is not None
    }
    assert planned == boundaries  # t and t + 1 of every switch, nothing else
    assert planned <= measured  # both sides of every switch were measured
    for s in surface.segments:
        # One kernel over the whole segment, another on each side of it.
        last = s.last if s.last is not None else top
        kernels = {steps.kernel(x) for x in range(s.first, last + 1)}
        assert len(kernels) == 1
        if s.last is not None:
            assert steps.kernel(s.last + 1) not in kernels
        assert s.surface is not None and s.rows.size > 0
        lo, hi = s.surface.support
        assert s.first <= lo and (s.last is None or hi <= s.last)


# -- answers never cross a switch ------------------------------------------------------


@settings(max_examples=40, deadline=None)
@given(target=st.sampled_from(F2K_TARGETS), i=st.integers(0, 10**6))
def test_every_measured_point_is_answered_exactly(target: tuple[str, int, int], i: int) -> None:
    d = deployment(*target)
    n, a, m, t = positive_points(d)
    j = i % n.size
    assert d.time_us("experts", int(n[j]), int(a[j]), int(m[j])) == float(t[j])
    got = d.batch("experts", n[j : j + 1], a[j : j + 1], m[j : j + 1])
    assert got.code[0] == OK and got.time_us[0] == float(t[j])


@st.composite
def f2k_query(draw: st.DrawFn) -> tuple[tuple[str, int, int], int, int, int]:
    target = draw(st.sampled_from(F2K_TARGETS))
    d = deployment(*target)
    g = d.entry.geometry
    top = int(positive_points(d)[0].max())
    n = draw(st.integers(1, top + top // 8))  # the support and a little past it
    a = draw(st.integers(1, g.local_experts))
    low, high = g.assignment_bounds(n, a)
    assume(low <= high)
    m = draw(st.integers(low, high))
    return target, n, a, m


@settings(max_examples=300, deadline=None)
@given(query=f2k_query())
def test_no_answer_crosses_a_kernel_switch(
    query: tuple[tuple[str, int, int], int, int, int],
) -> None:  # R40
    """Any feasible query is answered exactly as the points of its own kernel segment alone
    answer it, or refused: batch and scalar alike, and every vertex used is on its segment."""
    target, n, a, m = query
    d = deployment(*target)
    steps = planner_steps(d)
    segment = d._experts[("experts", "eager")]
    assert isinstance(segment, SegmentedExpertSurface)
    own = own_segment_surface(*target, segment.segment(n).first)
    q = (np.array([n]), np.array([a]), np.array([m]))
    got = d.batch("experts", *q)
    if own is None:
        assert got.code[0] == OUT_OF_SUPPORT
        return
    want, code = own.batch(*q)
    assert got.code[0] == code[0]
    assert np.array_equal(got.time_us, want, equal_nan=True)
    if code[0] == OK:
        assert d.time_us("experts", n, a, m) == float(want[0])  # scalar == batch, bit for bit
        table = load_table(d.root, d.entry)
        for vertex in explain_expert(d, table, n, a, m).vertices:
            assert steps.kernel(vertex.tokens) == steps.kernel(n)
    else:
        with pytest.raises(CoverageError):
            d.time_us("experts", n, a, m)


def test_the_straddling_query_of_the_bench_is_now_its_own_segments_answer() -> None:
    """docs/benchmarks.md's largest crossing: N = 385 at A = 40 on the DP1 table was answered
    with N = 384's 32-row-block rows; now from the 512 key's segment (N 385..768) only."""
    d = deployment("modular", 1, 0)
    own = own_segment_surface("modular", 1, 0, 385)
    assert own is not None
    want = own.time(385, 40, 385 * 8)
    assert d.time_us("experts", 385, 40, 385 * 8) == want
    g = d.entry.geometry
    n, a, m, t = positive_points(d)
    whole = ExpertSurface(n, a, m, t, g, label="whole").time(385, 40, 385 * 8)
    assert abs(whole - want) / want > 0.05  # the answer did change, by more than noise


def test_on_the_shipped_tables_the_segments_cover_the_whole_hull() -> None:  # R40
    """The plan measures every switch row over the same A and M as its grid, so the segments'
    supports add up to the table's: random feasible queries are answered by the segmented
    lookup exactly where one triangulation over the whole table answers them."""
    for target in F2K_TARGETS:
        d = deployment(*target)
        g = d.entry.geometry
        n, a, m, t = positive_points(d)
        whole = ExpertSurface(n, a, m, t, g, label="whole")
        qn, qa, qm = lookup_sample.sample(n, g.top_k, g.local_experts, g.remote_experts, 7)
        qn, qa, qm = qn[qa > 0], qa[qa > 0], qm[qa > 0]  # the A = M = 0 curve: tested below
        _, code = whole.batch(qn, qa, qm)
        assert np.array_equal(d.batch("experts", qn, qa, qm).code, code)


def test_a_query_outside_its_segments_support_is_refused_naming_the_segment() -> None:
    """Inside the whole table's hull but outside its own segment's (here made so by leaving out
    the A = 128 points of DP1's segment N 385..768): refused, never answered from another
    kernel or extrapolated, the message naming the segment and its kernel; REST-style answers
    (`answer`) carry the same message."""
    d = ComponentTables(F2K["modular"]).deployment(1, 1, 0)  # a private copy: patched below
    g = d.entry.geometry
    n, a, m, t = positive_points(d)
    keep = ~((n >= 385) & (n <= 768) & (a > 64))
    assert d.kernel_switches is not None
    surface = SegmentedExpertSurface(
        n[keep], a[keep], m[keep], t[keep], g, d.kernel_switches, label="experts/eager [dp1]"
    )
    d._experts[("experts", "eager")] = surface
    d.time_us.cache_clear()
    query = (500, 128, 4000)
    assert (
        ExpertSurface(n, a, m, t, g, label="whole").batch(*map(np.array, ([500], [128], [4000])))[
            1
        ][0]
        == OK
    )
    got = d.batch("experts", [query[0]], [query[1]], [query[2]])
    assert got.code[0] == OUT_OF_SUPPORT and np.isnan(got.time_us[0])
    with pytest.raises(CoverageError) as info:
        d.time_us("experts", *query)
    message = str(info.value)
    assert "kernel segment N 385..768 (BLOCK_SIZE_M=" in message
    assert "its points span N 385..768" in message
    assert "never across a configuration switch" in message
    answer = d.answer(
        [
            {
                "component": "experts",
                "tokens": query[0],
                "activated_experts": query[1],
                "local_assignments": query[2],
            }
        ]
    )
    assert answer == [{"error": "out_of_support", "message": message}]
    # Its neighbours across the switches still answer from their own segments.
    assert d.batch("experts", [384, 769], [128, 128], [384 * 8, 769 * 8]).code.tolist() == [OK, OK]


def test_all_remote_rows_stay_one_curve_over_the_table() -> None:
    """A = M = 0 runs no local pair: its curve is the table's, across segments (DP2 rank 0)."""
    d = deployment("modular", 2, 0)
    table = load_table(d.root, d.entry)
    rows = table.select("experts", "eager")
    remote = (table.activated_experts[rows] == 0) & (table.local_assignments[rows] == 0)
    tok = table.tokens[rows][remote]
    assert tok.size >= 2
    whole = ExpertSurface(
        table.tokens[rows],
        table.activated_experts[rows],
        table.local_assignments[rows],
        table.time_us[rows],
        d.entry.geometry,
        label="whole",
    )
    q = np.arange(int(tok.min()), int(tok.max()) + 1, 7, dtype=np.int64)
    zero = np.zeros_like(q)
    got = d.batch("experts", q, zero, zero)
    want = whole.batch(q, zero, zero)
    assert np.array_equal(got.time_us, want[0], equal_nan=True)
    assert (got.code == OK).all()


# -- corrupt records (R43) ---------------------------------------------------------------


def test_a_record_with_an_unknown_rule_or_another_geometry_is_a_corrupt_contract() -> None:
    d = deployment("modular", 2, 0)
    contract = copy.deepcopy(dict(d.entry.contract))
    assert contract_kernel_switches(contract, d.entry.geometry, "t") == d.kernel_switches
    unknown = copy.deepcopy(contract)
    unknown["expert_sampling"]["kernel_steps"]["rule"] = "vllm-9.9-triton-config-steps-v9"
    with pytest.raises(BundleError, match="not known to this reader"):
        contract_kernel_switches(unknown, d.entry.geometry, "t")
    # Rule v3 (issue 20 item 1) has v2's switches: a v3 record splits the table alike.
    v3 = copy.deepcopy(contract)
    v3["expert_sampling"]["kernel_steps"]["rule"] = "vllm-0.26.0-triton-config-steps-v3"
    assert contract_kernel_switches(v3, d.entry.geometry, "t") == d.kernel_switches
    # Rule v4 (v3 plus A values at EP1's 16-row rows) again has v2's switches.
    v4 = copy.deepcopy(contract)
    v4["expert_sampling"]["kernel_steps"]["rule"] = "vllm-0.26.0-triton-config-steps-v4"
    assert contract_kernel_switches(v4, d.entry.geometry, "t") == d.kernel_switches
    other = copy.deepcopy(contract)
    other["expert_sampling"]["kernel_steps"]["local_experts"] = 128
    with pytest.raises(BundleError, match="local_experts 128"):
        contract_kernel_switches(other, d.entry.geometry, "t")
    del contract["expert_sampling"]["kernel_steps"]
    assert contract_kernel_switches(contract, d.entry.geometry, "t") is None
