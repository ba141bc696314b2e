"""Bundle format 3: a table's expert loads and its fitted row-tile model (issue 18, part 2).

Recorded here into a copy of the shipped H200 bundle from the committed H200 measurement
(`docs/evidence/h200-load-spread/load_spread.json`), as `python -m acquisition.load_spread` does.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import yaml

from acquisition.load_spread import attach, rows_of
from moetables.bundle import open_bundle, validate_bundle
from moetables.bundle.loads import format_load_spread, read_load_spread
from moetables.errors import BundleError, QueryError
from moetables.lookup.tables import ComponentTables
from moetables.tiles import fit_tile_cost

ROOT = Path(__file__).resolve().parents[2]
H200 = ROOT / "bundles/H200/Qwen/Qwen3-30B-A3B-Instruct-2507/bf16"
F2 = ROOT / "bundles/H200-vllm-modular-f2/Qwen/Qwen3-30B-A3B-Instruct-2507/bf16"
TORCH_REFERENCE = ROOT / "bundles/H200-torch-reference/Qwen/Qwen3-30B-A3B-Instruct-2507/bf16"
HISTORICAL = ROOT / "bundles/llmservingsim-rtxpro6000/Qwen/Qwen3-30B-A3B-Instruct-2507/bf16"
EVIDENCE = ROOT / "docs/evidence/h200-load-spread/load_spread.json"
RAW = json.loads(EVIDENCE.read_text())


@pytest.fixture
def unfitted(tmp_path: Path) -> Path:
    """The shipped H200 bundle as it was before issue 18 recorded its tile costs (format 2): the
    same tables and quality evidence, no ``expert_loads``, no ``load_spread.csv``."""
    bundle = tmp_path / "unfitted" / "bf16"
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


@pytest.fixture
def fitted(unfitted: Path, tmp_path: Path) -> Path:
    bundle = tmp_path / "bf16"
    shutil.copytree(unfitted, bundle)
    costs = attach(bundle, RAW)
    assert costs == {
        "tp1": pytest.approx(1.416, abs=5e-4),
        "ep2": pytest.approx(1.764, abs=5e-4),
    }
    return bundle


def _meta(bundle: Path) -> dict:  # type: ignore[type-arg]
    return yaml.safe_load((bundle / "meta.yaml").read_text())


def test_it_records_each_tables_fitted_cost_keeping_every_file_byte_for_byte(
    fitted: Path, unfitted: Path
) -> None:
    """Tables and quality evidence keep their bytes; the TP's format becomes 3; each entry says
    its rows are balanced and carries its deployment's cost with the evidence beside it."""
    for path in unfitted.rglob("*"):
        if path.is_file() and path.name != "meta.yaml":
            assert (fitted / path.relative_to(unfitted)).read_bytes() == path.read_bytes(), path
    # The shipped bundle was re-published the same way (bundles/README.md): the same files,
    # but its TP1/DP1 table's, since re-recorded per block size (format 4,
    # tests/moetables/test_bundle_block_models.py reproduces those byte for byte).
    for path in fitted.rglob("*"):
        if path.is_file() and path.name != "meta.yaml" and "dp1_ep1" not in str(path):
            assert (H200 / path.relative_to(fitted)).read_bytes() == path.read_bytes(), path
    owner = _meta(fitted)["per_tp"][1]["moe_components"]
    assert owner["format_version"] == 3
    report = validate_bundle(fitted)
    assert report.ok, report.problems
    costs = {}
    for entry in report.bundle.entries:  # type: ignore[union-attr]
        loads = entry.expert_loads
        assert loads.rows == "balanced" and loads.tile_model is not None
        assert loads.tile_model.block_m == 128 and loads.tile_model.vllm_version == "0.26.0"
        costs[entry.target.dp] = loads.tile_model.tile_cost_us
        spread = report.loads[entry.table_path]
        assert len(spread) == 78
        deployment = "tp1" if entry.target.dp == 1 else "ep2"
        assert round(fit_tile_cost(spread).tile_cost_us, 3) == loads.tile_model.tile_cost_us
        assert {r.tokens for r in spread} == {r.tokens for r in rows_of(RAW, deployment)}
    # The two kernel configs cost differently per tile: the cost belongs to the table.
    assert costs == {1: 1.416, 2: 1.764}


def test_older_bundles_read_as_balanced_rows_without_a_model(unfitted: Path) -> None:
    for bundle in (unfitted, HISTORICAL, TORCH_REFERENCE):
        for entry in open_bundle(bundle).entries:
            assert entry.expert_loads.rows == "balanced" and entry.expert_loads.tile_model is None
    assert not validate_bundle(unfitted).loads


@pytest.mark.parametrize("bundle", [H200, F2], ids=["H200", "H200-vllm-modular-f2"])
def test_the_shipped_modular_h200_bundles_record_the_measured_costs(bundle: Path) -> None:
    """Issue 18: the TP1/DP1 table carries tp1's 1.416 us per 128-row tile (and, format 4, its
    64-row cost, and, format 5, its 32-row cost per wave), both DP2/EP2 ranks ep2's 1.764 (format 3), each refitted by the
    reader from the load_spread.csv beside it."""
    report = validate_bundle(bundle)
    assert report.ok, report.problems
    costs = {
        (e.target.dp, e.target.rank): {
            m.block_m: getattr(m, "tile_cost_us", None) or getattr(m, "wave_cost_us", None)
            for m in e.expert_loads.models
        }
        for e in report.bundle.entries  # type: ignore[union-attr]
    }
    assert costs == {
        (1, 0): {128: 1.416, 64: 0.541, 32: 17.57},  # 32: per wave (format 5)
        (2, 0): {128: 1.764},
        (2, 1): {128: 1.764},
    }
    sizes = {(e.target.dp, len(report.loads[e.table_path])) for e in report.bundle.entries}  # type: ignore[union-attr]
    assert sizes == {(1, 156), (2, 78)}


def test_a_described_lookup_defaults_to_the_tables_cost_and_balanced_stays_bit_for_bit(
    fitted: Path, unfitted: Path
) -> None:
    """Issue 18: a load description without tile_cost_us is charged at the table's own cost;
    a bundle without a model still refuses it; balanced answers are today's."""
    new, old = ComponentTables(fitted), ComponentTables(unfitted)
    for dp, rank, point, cost in (
        (1, 0, (2000, 128, 16000), 1.416),
        # 8192 pairs on 64 experts: the balanced 128 each fill one 128-row tile; a uniform
        # scatter puts about half the experts past it (at 12,000 pairs, 187.5 each, it
        # crosses no tile edge in expectation, and the charge is nil).
        (2, 1, (3000, 64, 8192), 1.764),
    ):
        tables, before = new.deployment(1, dp, rank), old.deployment(1, dp, rank)
        assert tables.fitted_tile_cost_us == cost and before.fitted_tile_cost_us is None
        default = tables.experts_time_us(*point, loads="uniform")
        assert default == before.experts_time_us(*point, loads="uniform", tile_cost_us=cost)
        assert default > tables.time_us("experts", *point)  # the scatter runs more tiles
        assert tables.time_us("experts", *point) == before.time_us("experts", *point)
        assert tables.experts_time_us(*point, loads="uniform", tile_cost_us=0.0) == (
            before.time_us("experts", *point)
        )
        with pytest.raises(QueryError, match="needs tile_cost_us"):
            before.experts_time_us(*point, loads="uniform")
        answers = tables.answer([{"component": "experts", "tokens": point[0],
                                  "activated_experts": point[1], "local_assignments": point[2],
                                  "loads": "power_law(1.2)"}])  # fmt: skip
        assert answers[0]["time_us"] == before.experts_time_us(
            *point, loads="power_law(1.2)", tile_cost_us=cost
        )
        batch = tables.batch("experts", [point[0]], [point[1]], [point[2]], loads="uniform")
        assert batch.time_us[0] == default and batch.code[0] == 0


def test_the_estimate_charges_each_rank_at_its_tables_cost_when_asked(
    fitted: Path, unfitted: Path
) -> None:
    rng = np.random.default_rng(3)
    counts = np.bincount(rng.integers(0, 128, 8 * 2 * 2048), minlength=128)
    new, old = ComponentTables(fitted), ComponentTables(unfitted)
    kwargs = {"tp": 1, "dp": 2, "policy": "histogram", "expert_counts": counts.tolist()}
    table = new.estimate([2048, 2048], tile_cost_us="table", **kwargs)
    explicit = old.estimate([2048, 2048], tile_cost_us=1.764, **kwargs)
    plain = new.estimate([2048, 2048], tile_cost_us="none", **kwargs)
    assert [r.compute_us for r in table.ranks] == [r.compute_us for r in explicit.ranks]
    assert all(a.compute_us > b.compute_us for a, b in zip(table.ranks, plain.ranks, strict=True))
    assert any("table's fitted cost" in n for n in table.notes)
    with pytest.raises(QueryError, match=r"ranks \[0, 1\] record no fitted tile cost") as refused:
        old.estimate([2048, 2048], tile_cost_us="table", **kwargs)
    # Both formats' fields are named (format 4 records tile_models; QA, session 5).
    assert "format 4's tile_models" in str(refused.value)


def _edit(bundle: Path, change: object) -> None:
    meta = _meta(bundle)
    entry = meta["per_tp"][1]["moe_components"]["entries"][0]
    change(meta, entry)  # type: ignore[operator]
    (bundle / "meta.yaml").write_text(yaml.safe_dump(meta, sort_keys=False))


@pytest.mark.parametrize(
    ("change", "fragment"),
    [
        (lambda m, e: e["expert_loads"]["tile_model"].update(tile_cost_us=1.5), "fits 1.416"),
        (lambda m, e: e["expert_loads"].update(rows="uniform"), "never read as balanced"),
        (
            lambda m, e: e["expert_loads"]["tile_model"].update(schema="row-tiles-v2"),
            "unknown tile",
        ),
        (lambda m, e: e["expert_loads"]["tile_model"].update(vllm_version="0.28.0"), "0.26.0"),
        (lambda m, e: e["expert_loads"]["tile_model"].pop("evidence"), "evidence"),
        (lambda m, e: e["expert_loads"].update(extra=1), "unknown keys"),
        (
            lambda m, e: m["per_tp"][1]["moe_components"].update(format_version=2),
            "needs format_version 3",
        ),
    ],
)
def test_it_refuses_a_model_that_is_not_what_its_evidence_says(
    fitted: Path, change: object, fragment: str
) -> None:
    _edit(fitted, change)
    report = validate_bundle(fitted)
    assert not report.ok
    assert any(fragment in p for p in report.problems), report.problems


def test_it_refuses_evidence_changed_after_publication(fitted: Path) -> None:
    path = fitted / "tp1/moe_components/dp1_ep1_rank0_sp0/load_spread.csv"
    rows = read_load_spread(path.read_text(), "x")
    path.write_bytes(format_load_spread(rows[1:]))
    with pytest.raises(BundleError, match="sha256"):
        from moetables.bundle.loads import load_spread_evidence

        load_spread_evidence(fitted, open_bundle(fitted).entries[0])
    assert hashlib.sha256(path.read_bytes()).hexdigest() not in (fitted / "meta.yaml").read_text()
