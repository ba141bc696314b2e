"""Bundle format 5: a cost per wave of the expert kernel's grid at 32-row blocks (issue 18).

The shipped bf16 TP1/DP1 tables charge vLLM's tuned 32-row blocks per weighted wave of
``fused_moe_kernel`` programs over the H200's 132 SMs at 2 programs per SM (`moetables.waves`;
docs/benchmarks.md, "The wave charge, built in"), 64- and 128-row blocks per tile as before.
Recorded here into a copy of the shipped bundle from the committed H200 measurements, as
`bundles/README.md` says `python -m acquisition.load_spread ... --waves 32:2:132` did.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from acquisition.load_spread import attach, held_out, merged, rows_of, wave_units
from moetables.bundle import validate_bundle
from moetables.bundle.model import WAVE_MODEL_SCHEMA, ExpertLoads, TileModel, WaveModel
from moetables.errors import QueryError
from moetables.lookup.tables import ComponentTables
from moetables.tiles import row_tiles
from moetables.waves import LoadCharge, WaveGrid, expected_waves

ROOT = Path(__file__).resolve().parents[2]
H200 = ROOT / "bundles/H200/Qwen/Qwen3-30B-A3B-Instruct-2507/bf16"
RAW = json.loads((ROOT / "docs/evidence/h200-load-spread/load_spread.json").read_text())
SMALL = json.loads(
    (ROOT / "docs/evidence/h200-fp8-load-spread/load_spread_bf16_small.json").read_text()
)
BOTH = merged([RAW, SMALL])
WAVE_COST = 17.57
GRID = WaveGrid(sms=132, programs_per_sm=2, hidden=2048, intermediate=768)


def _meta(bundle: Path) -> dict[str, Any]:
    return dict(yaml.safe_load((bundle / "meta.yaml").read_text()))


def _write(bundle: Path, meta: dict[str, Any]) -> None:
    (bundle / "meta.yaml").write_text(yaml.safe_dump(meta, sort_keys=False))


@pytest.fixture(scope="module")
def bundles(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The shipped bundle (format 5), the same with format 4's 32-row tile cost instead, and
    the table with no load model at all (format 2): the three answers compared below."""
    tmp = tmp_path_factory.mktemp("waves")
    out = {"v5": H200}
    v4 = tmp / "v4" / "bf16"
    shutil.copytree(H200, v4)
    attach(v4, BOTH, ["tp1"], blocks=[128, 64, 32])
    out["v4"] = v4
    v2 = tmp / "v2" / "bf16"
    shutil.copytree(H200, v2)
    meta = _meta(v2)
    owner = meta["per_tp"][1]["moe_components"]
    owner["format_version"] = 2
    for entry in owner["entries"]:
        entry.pop("expert_loads", None)
    _write(v2, meta)
    for path in v2.rglob("load_spread.csv"):
        path.unlink()
    out["v2"] = v2
    return out


def test_the_grid_steps_where_132_tiles_fill_the_sms() -> None:
    """At BLOCK_SIZE_N 256 a row tile is 6 w13 and 8 w2 programs: 132 tiles fill 3 and 4 waves
    of 264 slots exactly, 133 spill one more of each (a w2 wave weighs 768/2048)."""
    assert GRID.n_tiles(256) == (6, 8)
    assert GRID.waves([128, 132, 133, 160, 176], 256).tolist() == [
        3 + 0.375 * 4,
        3 + 0.375 * 4,
        4 + 0.375 * 5,
        4 + 0.375 * 5,
        4 + 0.375 * 6,
    ]
    # r = 1 would step at 154 (w13) and 149 (w2) too: the residency changes the charge.
    one = WaveGrid(132, 1, 2048, 768)
    assert one.waves([148, 149], 256).tolist() == [7 + 0.375 * 9, 7 + 0.375 * 10]


def test_the_shipped_tables_record_the_wave_model_and_the_reader_refits_it() -> None:
    report = validate_bundle(H200)
    assert report.ok, report.problems
    assert _meta(H200)["per_tp"][1]["moe_components"]["format_version"] == 5
    dp1 = next(e for e in report.bundle.entries if e.target.dp == 1).expert_loads  # type: ignore[union-attr]
    wave = dp1.block_model(32)
    assert isinstance(wave, WaveModel)
    assert (wave.schema, wave.wave_cost_us, wave.programs_per_sm, wave.sms) == (
        WAVE_MODEL_SCHEMA,
        WAVE_COST,
        2,
        132,
    )
    # The 32-row block has no cost per tile any more; 64 and 128 keep theirs.
    assert [dp1.block_cost_us(b) for b in (16, 32, 64, 128)] == [None, None, 0.541, 1.416]
    for b in ("H200-vllm-modular-f2", "H200-vllm-modular-f2k", "H200-vllm-live-f2k"):
        path = ROOT / "bundles" / b / "Qwen/Qwen3-30B-A3B-Instruct-2507/bf16"
        entries = _meta(path)["per_tp"][1]["moe_components"]["entries"]
        models = next(e for e in entries if e["target"]["dp"] == 1)["expert_loads"]["tile_models"]
        assert [m["schema"] for m in models][-1] == WAVE_MODEL_SCHEMA, b
        assert models[-1]["wave_cost_us"] == WAVE_COST, b


def _edit(bundle: Path, tmp: Path, change: Any) -> Path:
    dest = tmp / "edit" / "bf16"
    shutil.copytree(bundle, dest)
    meta = _meta(dest)
    owner = meta["per_tp"][1]["moe_components"]
    entry = next(e for e in owner["entries"] if e["target"]["dp"] == 1)
    change(owner, entry["expert_loads"]["tile_models"][-1])
    _write(dest, meta)
    return dest


@pytest.mark.parametrize(
    ("change", "fragment"),
    [
        # R30: a wave model is not a tile model; a format-4 reader's bundle may not hold it
        (lambda o, m: o.update(format_version=4), "needs format_version 5"),
        (lambda o, m: m.update(wave_cost_us=19.2), "fits 17.57"),
        (lambda o, m: m.update(programs_per_sm=1), "fits 9.716"),
        (lambda o, m: m.update(programs_per_sm=0), "integer >= 1"),
        (lambda o, m: m.update(sms=True), "integer >= 1"),
        (lambda o, m: m.update(tile_cost_us=0.714), "unknown keys"),
        (lambda o, m: m.pop("evidence"), "evidence"),
        (lambda o, m: m.update(schema="row-waves-v0"), "unknown tile model"),
    ],
)
def test_it_refuses_a_malformed_or_unfitted_wave_model(
    tmp_path: Path, change: Any, fragment: str
) -> None:
    report = validate_bundle(_edit(H200, tmp_path, change))
    assert not report.ok
    assert any(fragment in p for p in report.problems), report.problems


COUNTS = st.lists(st.integers(0, 60), min_size=128, max_size=128).filter(lambda c: sum(c) >= 8)


@settings(max_examples=60, deadline=None)
@given(counts=COUNTS, scale=st.sampled_from([1, 2, 3, 4, 8, 16]))
def test_balanced_is_bit_for_bit_and_only_32_row_blocks_change(
    bundles: dict[str, Path], counts: list[int], scale: int
) -> None:
    """Balanced answers are the format-2 table's bit for bit; a caller's tile_cost_us number
    and the 16/64/128-row charges answer exactly as format 4 did; 32-row blocks are charged
    the wave cost times the weighted waves beyond the balanced stimulus' at (N, A, M)."""
    v5, v4, v2 = (ComponentTables(bundles[k]).deployment(1, 1, 0) for k in ("v5", "v4", "v2"))
    c = np.array(counts) * scale
    a, m = int((c > 0).sum()), int(c.sum())
    n = max(m // 8, 1)
    try:
        base = v2.time_us("experts", n, a, m)
    except Exception:
        return  # out of the table's support
    assert v5.time_us("experts", n, a, m) == base
    assert v5.experts_time_us(n, a, m, loads="balanced") == base
    assert v5.experts_time_us(n, a, m, loads=c.tolist(), tile_cost_us=1.5) == (
        v4.experts_time_us(n, a, m, loads=c.tolist(), tile_cost_us=1.5)
    )
    config = v5.tile_shape().config(n)
    got = v5.experts_time_us(n, a, m, loads=c.tolist())
    if config.block_m != 32:
        assert got == v4.experts_time_us(n, a, m, loads=c.tolist())
        return
    base_tiles = row_tiles(_balanced(m, a), 32)
    run = GRID.waves(row_tiles(c, 32), config.block_n)
    ref = GRID.waves(base_tiles, config.block_n)
    assert got == pytest.approx(base + WAVE_COST * float(run - ref), rel=1e-12, abs=1e-9)


def _balanced(m: int, a: int) -> np.ndarray:
    base, extra = divmod(m, a)
    out = np.full(a, base)
    out[:extra] += 1
    return out


def test_the_step_at_n_384_is_one_wave_of_each_gemm(bundles: dict[str, Path]) -> None:
    """N = 384, 3,072 pairs on 128 experts (balanced: 24 each, 128 tiles): counts running 132
    tiles cost nothing more (the grid's waves are full), 133 tiles one w13 and one w2 wave."""
    t = ComponentTables(bundles["v5"]).deployment(1, 1, 0)
    base = t.experts_time_us(384, 128, 3072)
    for tiles, waves in ((128, 0.0), (132, 0.0), (133, 1.375), (160, 1.375)):
        extra = tiles - 128
        c = np.full(128, 24)
        c[:extra] = 33  # one more 32-row tile each
        c[extra : 2 * extra] -= 9  # the pairs they took, from experts that stay in one tile
        assert row_tiles(c, 32) == tiles and int(c.sum()) == 3072
        got = t.experts_time_us(384, 128, 3072, loads=c.tolist())
        assert got - base == pytest.approx(WAVE_COST * waves, abs=1e-9)


def test_a_distribution_is_charged_its_expected_waves_the_same_every_time(
    bundles: dict[str, Path],
) -> None:
    """uniform / power_law at 32-row blocks: the expected waves over the tile total's
    distribution (a step function of the tiles, so not the waves of the expected tiles), close
    to what multinomial draws give; repeatable, bit for bit."""
    t = ComponentTables(bundles["v5"]).deployment(1, 1, 0)
    base = t.experts_time_us(384, 128, 3072)
    uniform = t.experts_time_us(384, 128, 3072, loads="uniform")
    expected_waves.cache_clear()
    assert t.experts_time_us(384, 128, 3072, loads="uniform") == uniform
    w = expected_waves(0.0, 128, 3072, 32, 256, GRID, 384)
    assert 4.5 < w < 4 + 0.375 * 5 + 1e-9  # between the balanced 4.5 and one step up
    assert uniform == pytest.approx(base + WAVE_COST * (w - 4.5), rel=1e-12)
    skew = t.experts_time_us(384, 128, 3072, loads="power_law(1.2)")
    assert skew > uniform
    with pytest.raises(QueryError, match="power-law alpha"):
        t.experts_time_us(384, 128, 3072, loads="power_law(-1)")


@pytest.mark.parametrize(("alpha", "n"), [(0.0, 384), (0.6, 384), (1.2, 256), (0.0, 200)])
def test_expected_waves_are_what_routed_tokens_give(alpha: float, n: int) -> None:
    """The convolution of the bounded marginals against the process the load-spread runs timed
    (every token picks 8 distinct of 128 experts by power-law weight; draws with every expert
    active, as A = 128 says): within 0.06 weighted waves (1 us at the shipped cost)."""
    from tests.moetables.test_tiles import routed_tile_totals

    totals = routed_tile_totals(n, alpha, block_m=32, draws=600, seed=3)
    drawn = GRID.waves(totals, 256).mean()
    assert expected_waves(alpha, 128, 8 * n, 32, 256, GRID, n) == pytest.approx(drawn, abs=0.06)


def test_the_estimate_charges_waves_at_32_rows_and_names_them(bundles: dict[str, Path]) -> None:
    new, old = ComponentTables(bundles["v5"]), ComponentTables(bundles["v2"])
    v4 = ComponentTables(bundles["v4"])
    rng = np.random.default_rng(7)
    for n in (128, 384, 512, 2048):
        counts = np.bincount(rng.integers(0, 128, 8 * n), minlength=128)
        kwargs: dict[str, Any] = {"tp": 1, "dp": 1, "policy": "histogram"}
        kwargs["expert_counts"] = [counts.tolist()]
        table = new.estimate_batch([[n]], tile_cost_us="table", **kwargs)
        plain = old.estimate_batch([[n]], **kwargs)
        assert np.array_equal(
            new.estimate_batch([[n]], tile_cost_us="none", **kwargs).components["experts"],
            plain.components["experts"],
        )
        rank = new.deployment(1, 1, 0)
        a, m = int((counts > 0).sum()), int(counts.sum())
        delta = table.components["experts"][0, 0] - plain.components["experts"][0, 0]
        assert delta == pytest.approx(
            rank.experts_time_us(n, a, m, loads=counts.tolist()) - rank.experts_time_us(n, a, m),
            abs=1e-9,
        )
        if n != 384:
            same = v4.estimate_batch([[n]], tile_cost_us="table", **kwargs)
            assert np.array_equal(table.components["experts"], same.components["experts"])
        elif delta:
            assert any("per weighted wave" in x for x in table.notes), table.notes


def test_charge_at_is_the_one_choice() -> None:
    t = ComponentTables(H200).deployment(1, 1, 0)
    assert t.charge_at(32, None) == LoadCharge("waves", WAVE_COST, GRID)
    assert t.charge_at(64, None) == LoadCharge("tiles", 0.541)
    assert t.charge_at(16, None) is None
    assert t.charge_at(32, 1.0) is None and t.charge_at(128, 1.0) == LoadCharge("tiles", 1.0)
    assert t.tile_charge_us(32, None) is None and t.tile_charge_us(128, None) == 1.416
    assert t.fitted_tile_cost_us == 1.416 and t.tile_block_m == 128
    with pytest.raises(ValueError):
        LoadCharge("waves", 1.0)


def test_expert_loads_orders_wave_and_tile_models() -> None:
    tiles = TileModel("row-tiles-per-block-v1", "0.26.0", 64, 0.5, None)
    waves = WaveModel(WAVE_MODEL_SCHEMA, "0.26.0", 32, 17.0, 2, 132, None)
    loads = ExpertLoads(tile_models=(waves, tiles))
    assert loads.models == (tiles, waves) and loads.tile_only == (tiles,)
    assert loads.block_model(32) is waves and loads.block_cost_us(32) is None


def test_held_out_waves_beat_tiles_at_32_rows_only() -> None:
    """The recorded choice (docs/benchmarks.md, "The wave charge, built in"): at 32-row blocks
    waves at r = 2 predict every held-out distribution and N within 5 % (tiles: up to 8.5 %),
    and better than r = 1 or 3; at 64-row blocks waves do not beat tiles, so tiles stay."""
    rows = rows_of(BOTH, "tp1")
    worst = {}
    for r in (1, 2, 3):
        units = wave_units(H200, "tp1", r, 132)
        worst[r] = max(h.max_after for h in held_out(rows, 32, units))
    tiles32 = max(h.max_after for h in held_out(rows, 32))
    assert worst[2] < 5.0 < tiles32
    assert worst[2] < min(worst[1], worst[3])
    tiles64 = max(h.max_after for h in held_out(rows, 64))
    waves64 = max(h.max_after for h in held_out(rows, 64, wave_units(H200, "tp1", 2, 132)))
    assert tiles64 < waves64
