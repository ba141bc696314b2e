"""Issue 18: a captured step's per-expert counts cost row tiles the balanced tables do not hold.

The estimate's ``tile_cost_us`` charges every rank's expert kernel per row tile its counts run
beyond the balanced tiles its table embodies (`moetables.tiles`), only where vLLM's block is
128 rows; with ``tile_cost_us="none"`` the answer is the tables' balanced one, bit for bit (R41,
R44; the default, ``"auto"``, is tests/moetables/test_estimate_default_charge.py's)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from moetables.errors import QueryError
from moetables.lookup.tables import ComponentTables
from moetables.tiles import block_size_m, row_tiles

F2 = (
    Path(__file__).resolve().parents[2]
    / "bundles/H200-vllm-modular-f2/Qwen/Qwen3-30B-A3B-Instruct-2507/bf16"
)
# A shipped bundle of the same targets without a fitted tile cost (format 2).
UNFITTED = F2.parents[3] / "H200-torch-reference/Qwen/Qwen3-30B-A3B-Instruct-2507/bf16"


def _counts(seed: int, n: int) -> np.ndarray:
    """A router-like histogram over 128 experts: n tokens, top-8 distinct experts each."""
    rng = np.random.default_rng(seed)
    picks = np.argsort(rng.random((n, 128)), axis=1)[:, :8]
    return np.bincount(picks.ravel(), minlength=128)


def test_it_charges_the_extra_tiles_of_a_router_like_step() -> None:
    """Issue 18: at N = 2,048 a router's counts run about 30 tiles more than the table's 64 per
    rank; at 1.6 us a tile the experts component grows by exactly cost x extra tiles."""
    tables = ComponentTables(F2)
    counts = np.stack([_counts(3, 2048)])
    steps = np.array([[1024, 1024]])
    base = tables.estimate_batch(
        steps, tp=1, dp=2, policy="histogram", expert_counts=counts, tile_cost_us="none"
    )
    charged = tables.estimate_batch(
        steps, tp=1, dp=2, policy="histogram", expert_counts=counts, tile_cost_us=1.6
    )
    for rank in range(2):
        local = counts[0, 64 * rank : 64 * (rank + 1)]
        reference = tables.deployment(1, 2, rank).balanced_tiles(
            2048, int((local > 0).sum()), int(local.sum())
        )
        assert reference == pytest.approx(64.0, abs=1.5)  # about one 128-row tile per expert
        extra = row_tiles(local, block_size_m(2048, 64, 768)) - reference
        assert 15 < extra < 45
        delta = charged.components["experts"][0, rank] - base.components["experts"][0, rank]
        assert delta == pytest.approx(1.6 * extra)
        assert charged.compute_us[0, rank] > base.compute_us[0, rank]


def test_it_leaves_small_blocks_and_the_default_alone() -> None:
    """Issue 18: below 128-row blocks (N <= 512 here) nothing is charged; None is today's answer."""
    tables = ComponentTables(F2)
    counts = np.stack([_counts(5, 256)])
    steps = np.array([[128, 128]])
    a = tables.estimate_batch(steps, tp=1, dp=2, policy="histogram", expert_counts=counts)
    b = tables.estimate_batch(
        steps, tp=1, dp=2, policy="histogram", expert_counts=counts, tile_cost_us=1.6
    )
    c = tables.estimate_batch(
        steps, tp=1, dp=2, policy="histogram", expert_counts=counts, tile_cost_us=None
    )
    assert np.array_equal(a.compute_us, b.compute_us)
    assert np.array_equal(a.compute_us, c.compute_us)


def test_it_refuses_a_tile_cost_without_counts_or_with_a_bad_value() -> None:
    """Issue 18: the balanced policy has no per-expert counts to tile; a negative cost is named."""
    tables = ComponentTables(F2)
    with pytest.raises(QueryError, match="per-expert counts"):
        tables.estimate([1024, 1024], tp=1, dp=2, tile_cost_us=1.6)
    with pytest.raises(QueryError, match="tile_cost_us"):
        tables.estimate(
            [1024, 1024],
            tp=1,
            dp=2,
            policy="histogram",
            expert_counts=_counts(1, 2048).tolist(),
            tile_cost_us=-1.0,
        )


def test_it_reads_tile_cost_us_from_a_request_as_the_cli_and_rest_do(tmp_path: Path) -> None:
    """Issue 18: ``tile_cost_us`` in the one request parser (CLI ``--tile-cost-us``, REST field);
    refused, naming the field, for a policy without per-expert counts."""
    import io
    import json

    from moetables.cli import main
    from moetables.estimate_query import parse_estimate_request

    counts = _counts(3, 2048).tolist()
    path = tmp_path / "counts.json"
    path.write_text(json.dumps(counts))
    answers = []
    for extra in (["--tile-cost-us", "none"], ["--tile-cost-us", "1.6"]):
        out = io.StringIO()
        args = ["estimate", str(F2), "--tp", "1", "--dp", "2", "--tokens", "1024,1024"]
        args += ["--policy", "histogram", "--expert-counts", str(path), *extra]
        assert main(args, out=out) == 0
        answers.append(json.loads(out.getvalue()))
    before, after = (a["ranks"][0]["components"]["experts"] for a in answers)
    assert after > before
    with pytest.raises(QueryError, match="tile_cost_us: the balanced policy"):
        parse_estimate_request({"tp": 1, "dp": 2, "tokens": [4, 4], "tile_cost_us": 1.6})
    with pytest.raises(QueryError, match="tile_cost_us: must be a finite number"):
        parse_estimate_request(
            {"tp": 1, "dp": 2, "tokens": [4, 4], "policy": "random", "tile_cost_us": "x"}
        )


def test_it_answers_a_lookup_for_a_load_description() -> None:
    """Issue 18: ``balanced`` is the table's answer bit for bit; ``uniform``, ``power_law(alpha)``
    and explicit counts add cost x (their tiles - the table's balanced tiles), at 128-row blocks."""
    t = ComponentTables(F2).deployment(1, 2, 0)
    n, a, m = 2048, 64, 8192
    table = t.time_us("experts", n, a, m)
    assert t.experts_time_us(n, a, m) == table
    assert t.experts_time_us(n, a, m, loads="balanced", tile_cost_us=1.6) == table
    uniform = t.experts_time_us(n, a, m, loads="uniform", tile_cost_us=1.6)
    assert 1.6 * 25 < uniform - table < 1.6 * 35  # about 94 tiles against 64
    counts = [128] * 64
    assert t.experts_time_us(n, a, m, loads=counts, tile_cost_us=1.6) == pytest.approx(table)
    skew = [129] * 32 + [127] * 32
    assert t.experts_time_us(n, a, m, loads=skew, tile_cost_us=1.6) == pytest.approx(
        table + 1.6 * 32
    )
    assert t.experts_time_us(n, a, m, loads="power_law(0.6)", tile_cost_us=1.6) > table
    # 16-row blocks (N = 128 here has 64-row blocks): not charged.
    assert t.experts_time_us(128, 64, 512, loads="uniform", tile_cost_us=1.6) == t.time_us(
        "experts", 128, 64, 512
    )


def test_it_names_bad_load_descriptions() -> None:
    """Issue 18: unknown descriptions, counts that miss the query's (A, M) and a missing cost are
    refused, naming the problem."""
    t = ComponentTables(F2).deployment(1, 2, 0)
    with pytest.raises(QueryError, match="loads must be"):
        t.experts_time_us(2048, 64, 8192, loads="zipf", tile_cost_us=1.6)
    # The shipped F2 tables record their fitted cost (format 3): only a table without one refuses.
    bare = ComponentTables(UNFITTED).deployment(1, 2, 0)
    with pytest.raises(QueryError, match="needs tile_cost_us"):
        bare.experts_time_us(2048, 64, 8192, loads="uniform")
    assert t.experts_time_us(2048, 64, 8192, loads="uniform") == t.experts_time_us(
        2048, 64, 8192, loads="uniform", tile_cost_us=1.764
    )
    with pytest.raises(QueryError, match="8000 pairs on 64"):
        t.experts_time_us(2048, 64, 8192, loads=[125] * 64, tile_cost_us=1.6)
    with pytest.raises(QueryError, match="alpha"):
        t.experts_time_us(2048, 64, 8192, loads="power_law(-1)", tile_cost_us=1.6)
