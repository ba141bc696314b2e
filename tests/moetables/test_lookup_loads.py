"""Issue 18: a lookup query takes a load description (``loads``, ``tile_cost_us``), on every
path that reads queries (``answer``, ``batch``, ``time_us``, the CLI); without one, the answer
is today's, bit for bit (R39, R40, R44)."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from moetables import ComponentTables
from moetables.cli import main as cli_main
from moetables.errors import QueryError
from moetables.lookup.queries import parse_query, read_columns
from moetables.tiles import balanced_counts, block_size_m, row_tiles

ROOT = Path(__file__).resolve().parents[2] / "bundles"
F2 = ROOT / "H200-vllm-modular-f2/Qwen/Qwen3-30B-A3B-Instruct-2507/bf16"
H200 = ROOT / "H200/Qwen/Qwen3-30B-A3B-Instruct-2507/bf16"
RANK = ComponentTables(F2).deployment(1, 2, 0)
# Same targets, no fitted tile cost (format 2): the one that refuses a description without a cost.
BARE = ComponentTables(
    ROOT / "H200-torch-reference/Qwen/Qwen3-30B-A3B-Instruct-2507/bf16"
).deployment(1, 2, 0)
EXPERT = {
    "component": "experts",
    "tokens": 2048,
    "activated_experts": 64,
    "local_assignments": 8192,
}
SKEW = [129] * 32 + [127] * 32


def test_it_answers_a_described_query_as_experts_time_us_does() -> None:
    """Issue 18: each description's answer is `experts_time_us`'s, bit for bit, in a batch of
    any size (the one-by-one reader and the column reader)."""
    queries = [
        {**EXPERT, "loads": "uniform", "tile_cost_us": 1.6},
        {**EXPERT, "loads": "power_law(0.6)", "tile_cost_us": 2},
        {**EXPERT, "loads": SKEW, "tile_cost_us": 1.6},
        {**EXPERT, "loads": "balanced", "tile_cost_us": 1.6},
    ]
    expected = [
        RANK.experts_time_us(2048, 64, 8192, loads="uniform", tile_cost_us=1.6),
        RANK.experts_time_us(2048, 64, 8192, loads="power_law(0.6)", tile_cost_us=2.0),
        RANK.experts_time_us(2048, 64, 8192, loads=SKEW, tile_cost_us=1.6),
        RANK.time_us("experts", 2048, 64, 8192),
    ]
    assert expected[2] == pytest.approx(expected[3] + 1.6 * 32)  # 32 experts a tile more
    assert expected[0] > expected[3] and expected[1] > expected[3]
    for copies in (1, 10):  # 4 and 40 queries
        answers = RANK.answer(queries * copies)
        assert [a["time_us"] for a in answers] == expected * copies
    assert RANK.time_us("experts", 2048, 64, 8192, loads="uniform", tile_cost_us=1.6) == expected[0]
    assert (
        RANK.time_us("experts", 2048, 64, 8192, loads=tuple(SKEW), tile_cost_us=1.6)
        == (expected[2])
    )


@pytest.mark.parametrize(
    ("query", "fragment"),
    [
        ({**EXPERT, "loads": "zipf", "tile_cost_us": 1}, "loads must be 'balanced'"),
        # A negative alpha is refused as such, not as an unknown description (QA, session 5).
        ({**EXPERT, "loads": "power_law(-1)", "tile_cost_us": 1}, "alpha must be finite and >= 0"),
        ({**EXPERT, "loads": "power_law(+x)", "tile_cost_us": 1}, "loads must be 'balanced'"),
        ({**EXPERT, "loads": [1.5] * 64, "tile_cost_us": 1}, "integers >= 0"),
        ({**EXPERT, "loads": [], "tile_cost_us": 1}, "must not be empty"),
        ({**EXPERT, "loads": {"a": 1}, "tile_cost_us": 1}, "a string or a list"),
        ({**EXPERT, "loads": [125] * 64, "tile_cost_us": 1}, "8000 pairs on 64 experts"),
        ({**EXPERT, "loads": [128] * 62 + [0, 256], "tile_cost_us": 1}, "on 63 experts, the query"),
        ({**EXPERT, "loads": "uniform"}, "needs tile_cost_us"),
        ({**EXPERT, "tile_cost_us": 1.6}, "tile_cost_us needs loads"),
        ({**EXPERT, "loads": "uniform", "tile_cost_us": -1}, "finite number >= 0"),
        ({**EXPERT, "loads": "uniform", "tile_cost_us": "1"}, "finite number >= 0"),
        ({**EXPERT, "loads": "uniform", "tile_cost_us": True}, "finite number >= 0"),
        # The estimate's 'table' is not a lookup's cost: the message says what to do instead.
        ({**EXPERT, "loads": "uniform", "tile_cost_us": "table"}, "leave it out to charge"),
        (
            {"component": "gate_routing", "tokens": 4, "loads": "uniform", "tile_cost_us": 1},
            "for experts only, not 'gate_routing'",
        ),
        ({**EXPERT, "load": "uniform"}, "unknown keys 'load'"),
    ],
)
@pytest.mark.parametrize("count", [1, 40])
def test_it_refuses_a_bad_description_naming_the_problem(
    query: dict[str, Any], fragment: str, count: int
) -> None:
    """Issue 18: a bad description, counts that miss (A, M), a cost without a description or a
    description on a local component is the query's own ``invalid`` answer; the rest answer."""
    tables = BARE if fragment == "needs tile_cost_us" else RANK
    answers = tables.answer([EXPERT] * (count - 1) + [query])
    assert all("time_us" in a for a in answers[:-1])
    assert answers[-1]["error"] == "invalid"
    assert fragment in answers[-1]["message"], answers[-1]["message"]
    if fragment == "needs tile_cost_us":
        # The cost may be the table's own (bundle format 3): only the table can refuse it.
        assert parse_query(query).loads == "uniform"
        # The shipped F2 rank records 1.764 us per tile (format 3): it answers at that cost.
        assert RANK.answer([query])[0]["time_us"] == RANK.experts_time_us(
            2048, 64, 8192, loads="uniform", tile_cost_us=1.764
        )
        return
    with pytest.raises(QueryError):
        parse_query(query)


def test_a_described_query_leaves_the_column_reader() -> None:
    """Issue 18: the fast column reader takes plain queries only; a described one goes to
    ``parse_query`` (so the fast path never answers it as if undescribed)."""
    groups = {("experts", "eager"): 0}
    for count in (3, 40):
        queries = [EXPERT] * (count - 1) + [{**EXPERT, "loads": "balanced"}]
        _, rest = read_columns(queries, groups)
        assert rest == [count - 1]


def test_out_of_support_stays_out_of_support_with_a_description() -> None:
    answer = RANK.answer([{**EXPERT, "tokens": 10**6, "loads": "uniform", "tile_cost_us": 1}])
    assert answer[0]["error"] == "out_of_support"


coordinates = st.integers(1, 4096).flatmap(
    lambda n: st.integers(1, min(64, 8 * n)).flatmap(
        lambda a: st.tuples(st.just(n), st.just(a), st.integers(a, min(8 * n, 128 * a)))
    )
)


@settings(max_examples=60, deadline=None)
@given(coordinates)
def test_balanced_equals_no_description_bit_for_bit(point: tuple[int, int, int]) -> None:
    """Issue 18: ``balanced`` (with or without a cost) and explicit balanced counts answer as a
    query without a description, bit for bit, refusals included (F2 DP2 rank 0 and the H200 TP1
    tables)."""
    n, a, m = point
    plain = {"component": "experts", "tokens": n, "activated_experts": a, "local_assignments": m}
    for rank in (RANK, TP1):
        variants = [
            plain,
            {**plain, "loads": "balanced"},
            {**plain, "loads": "balanced", "tile_cost_us": 1.6},
            {**plain, "loads": balanced_counts(m, a).tolist(), "tile_cost_us": 1.6},
            {**plain, "loads": balanced_counts(m, a)[::-1].tolist(), "tile_cost_us": 0.7},
        ]
        answers = rank.answer(variants)
        assert all(x == answers[0] for x in answers[:3]), answers
        assert rank.answer(variants * 5) == answers * 5
        # Explicit balanced counts run the stimulus' tiles; the reference is the table's balanced
        # tiles interpolated as time is: between measured N they differ, and so do the answers,
        # by the cost per tile of the difference; with blocks under 128 rows, not at all.
        shape = rank.tile_shape()
        block = block_size_m(n, shape.local_experts, shape.width, device=shape.device)
        assert block == shape.config(n).block_m
        for x, cost in zip(answers[3:], (1.6, 0.7), strict=True):
            assert x.keys() == answers[0].keys()
            if "time_us" not in x:
                continue
            if block < 128:
                assert x == answers[0]
            else:
                extra = row_tiles(balanced_counts(m, a), block) - rank.balanced_tiles(n, a, m)
                assert x["time_us"] == pytest.approx(answers[0]["time_us"] + cost * extra)


@pytest.mark.parametrize("rank_name", ["f2", "tp1"])
def test_explicit_balanced_counts_equal_balanced_at_measured_points(rank_name: str) -> None:
    """Issue 18: at the table's own points the stimulus' counts, given explicitly, answer as
    ``balanced`` (the reference tiles are the stimulus' tiles there)."""
    rank = RANK if rank_name == "f2" else TP1
    n_col, a_col, m_col = rank._expert_points["eager"]
    checked = 0
    for n, a, m in zip(n_col.tolist(), a_col.tolist(), m_col.tolist(), strict=True):
        if a < 1 or m < a:
            continue
        plain = rank.time_us("experts", n, a, m)
        counts = balanced_counts(m, a).tolist()
        got = rank.experts_time_us(n, a, m, loads=counts, tile_cost_us=1.6)
        assert got == pytest.approx(plain, rel=1e-12, abs=1e-9), (n, a, m)
        checked += 1
    assert checked >= 30


TP1 = ComponentTables(H200).deployment(1, 1, 0)


def test_batch_takes_one_description_or_one_per_row() -> None:
    """Issue 18: ``batch(..., loads=, tile_cost_us=)`` answers each row as `experts_time_us`;
    a row whose counts miss its (A, M) is INVALID; whole-call mistakes raise."""
    n, a, m = [2048, 2048, 4096, 2048], [64, 64, 64, 64], [8192, 8192, 16384, 8192]
    plain = RANK.batch("experts", n, a, m)
    uniform = RANK.batch("experts", n, a, m, loads="uniform", tile_cost_us=1.6)
    assert uniform.time_us.tolist() == [
        RANK.experts_time_us(x, y, z, loads="uniform", tile_cost_us=1.6)
        for x, y, z in zip(n, a, m, strict=True)
    ]
    same = RANK.batch("experts", n, a, m, loads="balanced")
    assert np.array_equal(same.time_us, plain.time_us)
    rows = RANK.batch(
        "experts", n, a, m, loads=["balanced", SKEW, "uniform", [1] * 64], tile_cost_us=1.6
    )
    assert rows.time_us[0] == plain.time_us[0]
    assert rows.time_us[1] == RANK.experts_time_us(2048, 64, 8192, loads=SKEW, tile_cost_us=1.6)
    assert rows.time_us[2] == uniform.time_us[2]
    assert rows.code.tolist() == [0, 0, 0, 2] and np.isnan(rows.time_us[3])
    with pytest.raises(QueryError, match="needs tile_cost_us"):
        BARE.batch("experts", n, a, m, loads="uniform")
    own = RANK.batch("experts", n, a, m, loads="uniform")  # the table's own 1.764 us
    assert (
        own.time_us.tolist()
        == RANK.batch("experts", n, a, m, loads="uniform", tile_cost_us=1.764).time_us.tolist()
    )
    cases: list[tuple[dict[str, Any], str]] = [
        ({"tile_cost_us": 1.0}, "needs loads"),
        ({"loads": ["uniform"], "tile_cost_us": 1.0}, "one description per row"),
        ({"loads": [128] * 4, "tile_cost_us": 1.0}, "each row's description"),
    ]
    for kwargs, fragment in cases:
        with pytest.raises(QueryError, match=fragment):
            RANK.batch("experts", n, a, m, **kwargs)
    with pytest.raises(QueryError, match="for experts only"):
        RANK.batch("gate_routing", [4], loads="uniform", tile_cost_us=1.0)


def test_the_cli_reads_descriptions_from_jsonl(tmp_path: Path, capsys: Any) -> None:
    """Issue 18: ``python -m moetables lookup`` answers described queries as ``answer``."""
    queries = [
        EXPERT,
        {**EXPERT, "loads": "uniform", "tile_cost_us": 1.6},
        {**EXPERT, "loads": "uniform"},
    ]
    path = tmp_path / "q.jsonl"
    path.write_text("\n".join(json.dumps(q) for q in queries) + "\n")
    out = io.StringIO()
    code = cli_main(
        ["lookup", str(F2), "--tp", "1", "--dp", "2", "--rank", "0", "--queries", str(path)],
        out=out,
    )
    assert code == 0
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    assert lines == RANK.answer(queries)
    assert lines[1]["time_us"] > lines[0]["time_us"]
    # No cost given: the table's own (1.764 us per tile, recorded in the shipped F2 bundle).
    assert lines[2]["time_us"] == RANK.experts_time_us(
        2048, 64, 8192, loads="uniform", tile_cost_us=1.764
    )


def test_an_all_remote_row_is_the_tables_answer_under_any_description() -> None:
    """A rank that gets no pair (A = M = 0, the all-remote rows of the DP2 tables) has no tile
    to spread: a described lookup answers the table's time, not "active must be >= 1" (QA,
    session 5), in process and in a batch."""
    base = RANK.time_us("experts", 1024, 0, 0)
    for loads in ("uniform", "power_law(1.2)", [0] * 64):
        assert RANK.experts_time_us(1024, 0, 0, loads=loads) == base
        assert RANK.experts_time_us(1024, 0, 0, loads=loads, tile_cost_us=1.6) == base
    batch = RANK.batch("experts", [1024, 2048], [0, 64], [0, 8192], loads="uniform")
    assert batch.code.tolist() == [0, 0]
    assert batch.time_us[0] == base
    assert batch.time_us[1] == RANK.experts_time_us(2048, 64, 8192, loads="uniform")


F2K4 = ROOT / "H200-vllm-modular-f2k4/Qwen/Qwen3-30B-A3B-Instruct-2507/bf16"
FP8 = ROOT / "H200-vllm-modular-fp8-f2/Qwen/Qwen3-30B-A3B-Instruct-2507-FP8/fp8"
HISTORICAL = ROOT / "llmservingsim-rtxpro6000/Qwen/Qwen3-30B-A3B-Instruct-2507/bf16"


@pytest.mark.parametrize("alpha", [0.0, 1.2, 3.0, 5.0])
def test_no_distribution_is_charged_below_the_balanced_histogram_at_one_tile_each(
    alpha: float,
) -> None:
    """A user's pass on issue 18: at 64 pairs per expert and 64-row blocks each balanced expert
    runs one tile, the fewest any load of A active experts can; power_law(3) and (5) were
    answered 60 and 84 us below the table (an unbounded binomial left experts empty)."""
    rank = ComponentTables(F2K4).deployment(1, 1, 0)
    base = rank.time_us("experts", 1024, 128, 8192)
    assert rank.experts_time_us(1024, 128, 8192, loads=f"power_law({alpha})") >= base - 1e-9


def test_the_one_feasible_load_is_the_tables_answer() -> None:
    """M = N x A: every active expert holds all N rows, so any description is the balanced
    load (uniform was charged +5.6 us at (2048, 8, 16384))."""
    rank = ComponentTables(F2K4).deployment(1, 1, 0)
    base = rank.time_us("experts", 2048, 8, 16384)
    for loads in ("uniform", "power_law(1.2)", "power_law(20)", [2048] * 8):
        assert rank.experts_time_us(2048, 8, 16384, loads=loads) == pytest.approx(base, abs=1e-9)


def test_a_reference_across_a_block_switch_is_this_ns_own() -> None:
    """The FP8 table's points N = 128 (16-row blocks) and 256 (64-row) straddle N = 200: their
    interpolated balanced tiles (46) were of two sizes, and [200] x 8 (the only load at A = k
    there) was answered 11.9 us below the table; the estimate cut the same."""
    tables = ComponentTables(FP8)
    rank = tables.deployment(1, 1, 0)
    assert rank.balanced_tiles(200, 8, 1600) == 32.0  # 8 experts x ceil(200 / 64)
    base = rank.time_us("experts", 200, 8, 1600)
    assert rank.experts_time_us(200, 8, 1600, loads=[200] * 8) == base
    counts = [200] * 8 + [0] * 120
    charged = tables.estimate(
        [200], tp=1, dp=1, policy="histogram", expert_counts=counts, tile_cost_us="table"
    )
    assert charged.ranks[0].components["experts"] == base
    # At the table's own points the interpolated tiles are the point's, as before.
    assert rank.balanced_tiles(256, 8, 2048) == 32.0


def test_counts_no_router_can_give_are_refused_by_the_lookup_as_by_the_estimate() -> None:
    rank = ComponentTables(F2K4).deployment(1, 1, 0)
    with pytest.raises(QueryError, match=r"expert 0 holds 16377 pairs.*at most N=2048"):
        rank.experts_time_us(2048, 8, 16384, loads=[16377] + [1] * 7)
    with pytest.raises(QueryError, match="1128 per-expert counts, but this rank has 128"):
        rank.experts_time_us(2048, 8, 16384, loads=[2048] * 8 + [0] * 1120)
    with pytest.raises(QueryError, match="at most N=10"):
        parse_query({**EXPERT, "tokens": 10, "activated_experts": 2, "local_assignments": 20,
                     "loads": [19, 1]})  # fmt: skip
    bad = rank.batch("experts", [2048], [8], [16384], loads=[[16377] + [1] * 7])
    assert bad.code.tolist() == [2] and np.isnan(bad.time_us).all()


def test_time_us_takes_counts_as_a_list_or_an_array() -> None:
    """The README's `rank.time_us(..., loads=...)` with a list raised "unhashable type"."""
    rank = ComponentTables(F2K4).deployment(1, 1, 0)
    as_tuple = rank.time_us("experts", 2048, 128, 16384, loads=tuple([128] * 128))
    assert rank.time_us("experts", 2048, 128, 16384, loads=[128] * 128) == as_tuple
    assert rank.time_us("experts", 2048, 128, 16384, loads=np.full(128, 128)) == as_tuple
    with pytest.raises(QueryError, match="per-expert counts"):
        rank.time_us("experts", 2048, 128, 16384, loads=[{"a": 1}])


def test_a_historical_table_answers_balanced_only_as_documented() -> None:
    """docs/bundle-format.md: unbalanced queries on historical tables are a CoverageError (they
    were a QueryError asking for a tile_cost_us, then for a contract field the table cannot
    have); balanced stays the publisher's answer."""
    from moetables.errors import CoverageError

    rank = ComponentTables(HISTORICAL).deployment(1, 2, 0)
    base = rank.time_us("experts", 256, 64, 1024)
    assert rank.time_us("experts", 256, 64, 1024, loads="balanced") == base
    for kw in ({"loads": "uniform"}, {"loads": "uniform", "tile_cost_us": 1.0}):
        with pytest.raises(CoverageError, match="historical table answers balanced queries only"):
            rank.time_us("experts", 256, 64, 1024, **kw)
    with pytest.raises(CoverageError, match="historical"):
        rank.batch("experts", [256], [64], [1024], loads="uniform", tile_cost_us=1.0)


def test_a_tile_cost_that_would_overflow_is_refused() -> None:
    rank = ComponentTables(F2K4).deployment(1, 1, 0)
    with pytest.raises(QueryError, match="at most 1,000,000"):
        rank.experts_time_us(2048, 128, 16384, loads="uniform", tile_cost_us=1e308)
    with pytest.raises(QueryError, match="at most 1,000,000"):
        ComponentTables(F2K4).estimate([2048], tp=1, dp=1, policy="random", tile_cost_us=1e308)
