"""The committed H200 load-spread measurement (issue 18 part 1; docs/benchmarks.md, "Measured:
the expert kernels under spread loads at fixed N"): every figure there is recomputed here from
the raw file, so the prose cannot drift from the data."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from acquisition.load_spread import LoadSpreadError, rows_of
from bench.load_spread import kernel_report
from moetables.tiles import block_size_m, row_tiles
from tests.json_close import json_close

ROOT = Path(__file__).resolve().parents[2]
EVIDENCE = ROOT / "docs/evidence/h200-load-spread"
RAW = json.loads((EVIDENCE / "load_spread.json").read_text())


def test_it_is_a_complete_stable_h200_run_whose_tiles_moetables_reproduces() -> None:
    results = RAW["results"]
    assert RAW["meta"]["gpu"] == "NVIDIA H200" and len(results) == 156
    assert not any("error" in r or r["unstable"] for r in results)
    for r in results:
        local = r["local_experts"]
        assert r["block_m"] == block_size_m(r["N"], local, 768)
        counts = np.array(r["counts"])
        assert r["tiles"] == row_tiles(counts, r["block_m"])
        assert (r["M"], r["A"], r["max"]) == (counts.sum(), (counts > 0).sum(), counts.max())
        assert abs(r["b2_us"] / r["b_us"] - 1) <= 0.03
    with pytest.raises(LoadSpreadError):
        rows_of(RAW, "ep4")


def test_the_report_is_what_the_raw_file_gives() -> None:
    committed = json.loads((EVIDENCE / "report.json").read_text())
    assert json_close(json.loads(json.dumps(kernel_report(RAW))), committed)


def test_tiles_explain_the_extra_time_and_the_spread_does_not() -> None:
    """R^2 of the extra time over the balanced arm (128-row blocks): tiles 0.81 / 0.92, the
    coefficient of variation 0.12 / 0.06 (tp1 / ep2)."""
    for deployment, tiles_r2, cv_r2 in (("tp1", 0.81, 0.12), ("ep2", 0.92, 0.06)):
        rows = rows_of(RAW, deployment)
        bal = {r.tokens: r for r in rows if r.distribution == "balanced"}
        spread = [r for r in rows if r.block_m >= 128 and r.distribution != "balanced"]
        y = np.array([r.b2_us - bal[r.tokens].b2_us for r in spread])
        x = np.array([r.tiles - bal[r.tokens].tiles for r in spread], dtype=float)
        res = y - (x @ y) / (x @ x) * x
        total = (y - y.mean()) @ (y - y.mean())
        assert 1 - res @ res / total == pytest.approx(tiles_r2, abs=0.005)
        a = np.c_[np.ones(len(spread)), [r.cv for r in spread]]
        res = y - a @ np.linalg.lstsq(a, y, rcond=None)[0]
        assert 1 - res @ res / total == pytest.approx(cv_r2, abs=0.005)


def test_each_deployment_has_its_own_cost_and_it_predicts_held_out_distributions() -> None:
    report = kernel_report(RAW)
    assert report["tp1"]["tile_cost_us"] == pytest.approx(1.416, abs=5e-4)
    assert report["ep2"]["tile_cost_us"] == pytest.approx(1.764, abs=5e-4)
    for deployment in ("tp1", "ep2"):
        held = report[deployment]["leave_one_distribution_out"]
        assert len(held) == 3 and all(h["records"] == 20 for h in held)
        # The tiles cut the worst error of every held-out spread distribution by more than half,
        # and the median to at most 2 %.
        assert all(h["max_after"] < 0.5 * h["max_before"] for h in held)
        assert all(h["median_after"] <= 0.021 for h in held)
        assert max(h["max_after"] for h in held) < 0.071
    # Uniform routing is free where it runs the balanced tiles and 12-18 % where it does not.
    for deployment in ("tp1", "ep2"):
        table = report[deployment]["table"]
        uniform = {t["N"]: t["over_balanced"] for t in table if t["distribution"] == "uniform"}
        assert all(1.0 <= uniform[n] <= 1.02 for n in (1024, 1536, 3072))
        assert all(1.12 <= uniform[n] <= 1.19 for n in (2048, 4096))
