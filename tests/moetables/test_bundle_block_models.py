"""Bundle format 4: one row-tile cost per vLLM block size (issue 18, ``expert_loads.tile_models``).

Recorded here into a copy of the shipped H200 bundle from the committed H200 measurements
(`docs/evidence/h200-load-spread/load_spread.json` and the session-5 small-block file
`docs/evidence/h200-fp8-load-spread/load_spread_bf16_small.json`), as `bundles/README.md` says
`python -m acquisition.load_spread` did for the shipped bundles.
"""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from acquisition.load_spread import attach, held_out, merged, rows_of
from moetables.bundle import open_bundle, validate_bundle
from moetables.bundle.model import BLOCK_TILE_MODEL_SCHEMA, ExpertLoads, TileModel
from moetables.client import RemoteDeployment, _block_costs
from moetables.errors import BundleError
from moetables.geometry import MoeTarget
from moetables.lookup.tables import ComponentTables
from moetables.tiles import row_tiles

ROOT = Path(__file__).resolve().parents[2]
H200 = ROOT / "bundles/H200/Qwen/Qwen3-30B-A3B-Instruct-2507/bf16"
FP8 = ROOT / "bundles/H200-vllm-modular-fp8-f2/Qwen/Qwen3-30B-A3B-Instruct-2507-FP8/fp8"
RAW = json.loads((ROOT / "docs/evidence/h200-load-spread/load_spread.json").read_text())
SMALL = json.loads(
    (ROOT / "docs/evidence/h200-fp8-load-spread/load_spread_bf16_small.json").read_text()
)
BOTH = merged([RAW, SMALL])
SHIPPED = {128: 1.416, 64: 0.541, 32: 0.714}


def _meta(bundle: Path) -> dict[str, Any]:
    return dict(yaml.safe_load((bundle / "meta.yaml").read_text()))


@pytest.fixture(scope="module")
def unfitted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The shipped H200 bundle before issue 18 (format 2: no expert_loads, no load_spread.csv)."""
    bundle = tmp_path_factory.mktemp("unfitted") / "bf16"
    shutil.copytree(H200, bundle)
    meta = _meta(bundle)
    owner = meta["per_tp"][1]["moe_components"]
    owner["format_version"] = 2
    for entry in owner["entries"]:
        entry.pop("expert_loads", None)
    (bundle / "meta.yaml").write_text(yaml.safe_dump(meta, sort_keys=False))
    for path in bundle.rglob("load_spread.csv"):
        path.unlink()
    return bundle


def _copy(src: Path, tmp: Path, name: str) -> Path:
    dest = tmp / name / "bf16"
    shutil.copytree(src, dest)
    return dest


@pytest.fixture(scope="module")
def per_block(unfitted: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """As shipped: format 3 for every rank (one 128-row cost each), then the TP1/DP1 table's
    costs per block size (128, 64, 32) from both kernel runs."""
    bundle = _copy(unfitted, tmp_path_factory.mktemp("per_block"), "x")
    attach(bundle, RAW)
    costs = attach(bundle, BOTH, ["tp1"], blocks=[128, 64, 32])
    assert costs == {"tp1": {b: pytest.approx(c, abs=5e-4) for b, c in SHIPPED.items()}}
    return bundle


@pytest.fixture(scope="module")
def per_wave(per_block: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """As shipped since format 5: the TP1/DP1 table's 32-row blocks charged per wave of the
    kernel's grid (2 programs per SM, 132 SMs), 128 and 64 per tile as before."""
    bundle = _copy(per_block, tmp_path_factory.mktemp("per_wave"), "x")
    costs = attach(bundle, BOTH, ["tp1"], blocks=[128, 64, 32], waves={32: (2, 132)})
    assert costs == {
        "tp1": {128: pytest.approx(1.416, abs=5e-4), 64: pytest.approx(0.541, abs=5e-4), 32: 17.57}
    }
    return bundle


def test_the_shipped_bundle_is_the_writers_output_byte_for_byte(per_wave: Path) -> None:
    """bundles/H200 is exactly what the three documented commands write (never edited by
    hand): format 3, then format 4's per-block costs, then format 5's 32-row wave model."""
    written = sorted(p.relative_to(per_wave) for p in per_wave.rglob("*") if p.is_file())
    shipped = sorted(p.relative_to(H200) for p in H200.rglob("*") if p.is_file())
    assert written == shipped
    for rel in written:
        assert (per_wave / rel).read_bytes() == (H200 / rel).read_bytes(), rel


def test_the_reader_refits_each_block_and_keeps_the_other_ranks_on_format_3(
    per_block: Path,
) -> None:
    report = validate_bundle(per_block)
    assert report.ok, report.problems
    assert _meta(per_block)["per_tp"][1]["moe_components"]["format_version"] == 4
    by_dp = {e.target.dp: e.expert_loads for e in report.bundle.entries}  # type: ignore[union-attr]
    dp1 = by_dp[1]
    assert dp1.tile_model is None
    assert {m.block_m: m.tile_cost_us for m in dp1.tile_models} == SHIPPED
    assert all(m.schema == BLOCK_TILE_MODEL_SCHEMA for m in dp1.tile_models)
    # 16-row blocks: leave-one-N-out makes it worse (below), so nothing is recorded there.
    assert dp1.block_cost_us(16) is None and dp1.block_cost_us(256) is None
    assert by_dp[2].tile_model is not None and by_dp[2].tile_models == ()
    assert by_dp[2].block_cost_us(128) == 1.764 and by_dp[2].block_cost_us(64) is None


def _edit(bundle: Path, change: Any) -> None:
    meta = _meta(bundle)
    change(meta["per_tp"][1]["moe_components"], meta["per_tp"][1]["moe_components"]["entries"][0])
    (bundle / "meta.yaml").write_text(yaml.safe_dump(meta, sort_keys=False))


def _models(entry: dict[str, Any]) -> list[dict[str, Any]]:
    return list(entry["expert_loads"]["tile_models"])


@pytest.mark.parametrize(
    ("change", "fragment"),
    [
        # R30: a per-block cost is not a format-3 reader's "at least block_m" cost
        (lambda o, e: o.update(format_version=3), "tile_models needs format_version 4"),
        (lambda o, e: _models(e)[1].update(block_m=128), "names a block size twice"),
        (lambda o, e: e["expert_loads"].update(tile_models=[]), "non-empty list"),
        (
            lambda o, e: e["expert_loads"].update(tile_model=copy.deepcopy(_models(e)[0])),
            "both tile_model and tile_models",
        ),
        (lambda o, e: _models(e)[0].update(schema="row-tiles-v1"), "unknown tile model"),
        (lambda o, e: _models(e)[2].update(tile_cost_us=0.9), "fits 0.714"),
        (lambda o, e: _models(e)[1].update(block_m=16), "fits"),
        (lambda o, e: _models(e)[1].pop("evidence"), "evidence"),
    ],
)
def test_it_refuses_a_malformed_or_unsupported_per_block_model(
    per_block: Path, tmp_path: Path, change: Any, fragment: str
) -> None:
    bundle = _copy(per_block, tmp_path, "edit")
    _edit(bundle, change)
    report = validate_bundle(bundle)
    assert not report.ok
    assert any(fragment in p for p in report.problems), report.problems


def test_a_format_6_bundle_is_refused(per_block: Path, tmp_path: Path) -> None:
    bundle = _copy(per_block, tmp_path, "v6")
    _edit(bundle, lambda o, e: o.update(format_version=6))
    with pytest.raises(BundleError, match="unknown format version 6"):
        open_bundle(bundle)


@pytest.fixture(scope="module")
def only_128(unfitted: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The same 128-row cost recorded both ways: format 3 (at least 128) and format 4 (128)."""
    tmp = tmp_path_factory.mktemp("only_128")
    v3, v4 = _copy(unfitted, tmp, "v3"), _copy(unfitted, tmp, "v4")
    attach(v3, RAW)
    attach(v4, RAW, blocks=[128])
    return v3, v4


COUNTS = st.lists(st.integers(0, 60), min_size=128, max_size=128).filter(lambda c: sum(c) >= 8)


@settings(max_examples=40, deadline=None)
@given(counts=COUNTS, scale=st.sampled_from([1, 4, 16, 40]), named=st.booleans())
def test_a_format_4_model_of_one_block_answers_as_format_3_does(
    only_128: tuple[Path, Path], counts: list[int], scale: int, named: bool
) -> None:
    """Backward compatibility: 128 rows is vLLM's largest block, so a per-block 128-row cost and
    a format-3 'at least 128 rows' cost are the same charge, bit for bit, at every N."""
    v3, v4 = (ComponentTables(b).deployment(1, 1, 0) for b in only_128)
    c = np.array(counts) * scale
    a, m = int((c > 0).sum()), int(c.sum())
    n = max(m // 8, 1)
    cost = 1.416 if named else None
    try:
        want = v3.experts_time_us(n, a, m, loads=c.tolist(), tile_cost_us=cost)
    except Exception as exc:  # out of support: both refuse alike
        with pytest.raises(type(exc)):
            v4.experts_time_us(n, a, m, loads=c.tolist(), tile_cost_us=cost)
        return
    assert v4.experts_time_us(n, a, m, loads=c.tolist(), tile_cost_us=cost) == want


@settings(max_examples=40, deadline=None)
@given(counts=COUNTS, scale=st.sampled_from([1, 2, 3, 4, 8, 16]))
def test_the_charge_is_the_blocks_own_cost_and_balanced_is_bit_for_bit(
    per_block: Path, unfitted: Path, counts: list[int], scale: int
) -> None:
    """Issue 18: counts at N are charged the cost of the block vLLM picks at N (none recorded:
    no charge); balanced answers are the format-2 table's, bit for bit."""
    tables = ComponentTables(per_block).deployment(1, 1, 0)
    before = ComponentTables(unfitted).deployment(1, 1, 0)
    c = np.array(counts) * scale
    a, m = int((c > 0).sum()), int(c.sum())
    n = max(m // 8, 1)
    try:
        base = before.time_us("experts", n, a, m)
    except Exception:
        return  # out of the table's support
    assert tables.time_us("experts", n, a, m) == base
    assert tables.experts_time_us(n, a, m, loads="balanced") == base
    block = tables.tile_shape().config(n).block_m
    cost = SHIPPED.get(block)
    got = tables.experts_time_us(n, a, m, loads=c.tolist())
    if cost is None:
        assert got == base
    else:
        extra = row_tiles(c[c > 0], block) - tables.balanced_tiles(n, a, m)
        assert got == pytest.approx(base + cost * extra, rel=1e-12, abs=1e-9)


def test_the_estimate_charges_each_step_at_its_blocks_cost(per_block: Path, unfitted: Path) -> None:
    """tile_cost_us='table': N = 384 (32-row blocks) at 0.714, N = 512 (64) at 0.541, N = 2,048
    (128) at 1.416, N = 128 (16) not at all; the note names each block charged."""
    new, old = ComponentTables(per_block), ComponentTables(unfitted)
    rng = np.random.default_rng(7)
    for n, block in ((128, 16), (384, 32), (512, 64), (2048, 128)):
        counts = np.bincount(rng.integers(0, 128, 8 * n), minlength=128)
        kwargs: dict[str, Any] = {"tp": 1, "dp": 1, "policy": "histogram"}
        kwargs["expert_counts"] = [counts.tolist()]
        table = new.estimate_batch([[n]], tile_cost_us="table", **kwargs)
        plain = old.estimate_batch([[n]], **kwargs)
        rank = new.deployment(1, 1, 0)
        a, m = int((counts > 0).sum()), int(counts.sum())
        extra = row_tiles(counts, block) - rank.balanced_tiles(n, a, m)
        delta = table.components["experts"][0, 0] - plain.components["experts"][0, 0]
        assert delta == pytest.approx(SHIPPED.get(block, 0.0) * extra, abs=1e-9)
        if block in SHIPPED and extra:
            assert any(f"{SHIPPED[block]:g} us where vLLM's block is {block} rows" in x
                       for x in table.notes), table.notes  # fmt: skip


def test_a_format_3_table_keeps_its_note_and_explicit_costs_keep_their_blocks(
    per_block: Path, unfitted: Path
) -> None:
    """An explicit tile_cost_us is one number for blocks of at least tile_block_m (128 on the
    bf16 tables, format 4 included): answers as before this format."""
    new, old = ComponentTables(per_block), ComponentTables(unfitted)
    for n in (512, 2048):
        counts = np.bincount(np.random.default_rng(1).integers(0, 128, 8 * n), minlength=128)
        kwargs: dict[str, Any] = {"tp": 1, "dp": 1, "policy": "histogram"}
        kwargs["expert_counts"] = [counts.tolist()]
        a = new.estimate_batch([[n]], tile_cost_us=1.416, **kwargs)
        b = old.estimate_batch([[n]], tile_cost_us=1.416, **kwargs)
        assert np.array_equal(a.components["experts"], b.components["experts"])
        assert any("at least 128 rows" in x for x in a.notes)


def test_the_fp8_format_3_table_answers_as_before() -> None:
    """FP8's one model (64 rows, format 3) covers every block of at least 64 rows, still."""
    loads = open_bundle(FP8).entries[0].expert_loads
    assert loads.tile_model is not None and loads.tile_models == ()
    assert [loads.block_cost_us(b) for b in (16, 32, 64, 128)] == [None, None, 0.85, 0.85]


def test_the_registry_client_reads_the_per_block_costs() -> None:
    """RemoteDeployment answers tile_cost_at from the registry's statement of the table."""
    stated = [{"block_m": 128, "tile_cost_us": 1.416}, {"block_m": 32, "tile_cost_us": 0.714}]
    costs = _block_costs(stated)
    target = MoeTarget(tp=1, dp=1, ep=1, rank=0, sequence_parallel=False)
    remote = RemoteDeployment(
        None,  # type: ignore[arg-type]
        target,
        {"sha256": "x"},
        ["experts"],
        ["eager"],
        1.416,
        128,
        costs,
    )
    assert [remote.tile_cost_at(b) for b in (16, 32, 64, 128)] == [None, 0.714, None, 1.416]
    assert remote.tile_charge_us(32, 2.0) is None and remote.tile_charge_us(128, 2.0) == 2.0
    one = RemoteDeployment(None, target, {"sha256": "x"}, ["experts"], ["eager"], 0.85, 64)  # type: ignore[arg-type]
    assert [one.tile_cost_at(b) for b in (32, 64, 128)] == [None, 0.85, 0.85]


def test_expert_loads_per_block_lookup_is_exact() -> None:
    m = [TileModel(BLOCK_TILE_MODEL_SCHEMA, "0.26.0", b, c, None) for b, c in SHIPPED.items()]
    loads = ExpertLoads(tile_models=tuple(m))
    assert [loads.block_cost_us(b) for b in (16, 32, 64, 128)] == [None, 0.714, 0.541, 1.416]
    assert [x.block_m for x in loads.models] == [128, 64, 32]


def test_held_out_decides_which_blocks_are_recorded() -> None:
    """What the shipped choice rests on (docs/benchmarks.md, "One cost per block size"): at 64
    and 32 rows every held-out distribution and N is predicted no worse with the charge than
    without; at 16 rows leaving N = 128 out makes it worse, so 16 is not recorded."""
    rows = rows_of(BOTH, "tp1")
    for block in (128, 64, 32):
        for h in held_out(rows, block):
            assert h.median_after <= h.median_before + 1e-9 or h.by == "N", h
            assert h.max_after <= h.max_before + 1e-9 or block == 128, h
    by = {(h.by, h.group): h for h in held_out(rows, 64)}
    assert max(h.max_after for h in by.values()) < 2.6
    small = {(h.by, h.group): h for h in held_out(rows, 16)}
    assert small[("N", "128")].max_after > 4 * small[("N", "128")].max_before
