"""The H200 wave probe (issue 18): what docs/evidence/h200-wave-probe/README.md says of it.

The probe times vLLM's expert kernel at 32-row blocks with constructed counts running 128 to
160 row tiles; the shipped wave charge (bundle format 5: 17.57 us per weighted wave, 2 programs
per SM, 132 SMs) was fitted before it, on the load-spread records, so this is out of sample.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.wave_probe import PROBE, report
from moetables.lookup.tables import ComponentTables
from moetables.waves import LoadCharge, WaveGrid

ROOT = Path(__file__).resolve().parents[2]
H200 = ROOT / "bundles/H200/Qwen/Qwen3-30B-A3B-Instruct-2507/bf16"


@pytest.fixture(scope="module")
def rep() -> dict[str, object]:
    return report(ROOT / PROBE)


def test_the_probe_ran_on_the_h200_the_charge_assumes() -> None:
    raw = json.loads((ROOT / PROBE).read_text())
    assert raw["meta"]["gpu"] == "NVIDIA H200" and raw["meta"]["sms"] == 132
    assert len(raw["results"]) == 99 and {r["block_m"] for r in raw["results"]} == {32}
    assert json.loads((ROOT / PROBE.parent / "report.json").read_text()) == report(ROOT / PROBE)


def test_the_step_is_at_133_tiles_and_flat_to_160(rep: dict[str, object]) -> None:
    per_n = rep["per_N"]  # type: ignore[index]
    assert set(per_n) == {"200", "256", "384"}
    for n in per_n.values():
        assert 0 < n["excess_at_132_us"] < 3  # 128 -> 132: a few us, not a wave
        assert 22 < n["step_132_to_133_us"] < 24  # one wave of each GEMM
        low, high = n["excess_133_to_160_us"]
        assert low > 20 and high < 31  # no second step up to 160 tiles (r = 1 would have one)
        assert n["step_132_to_133_us"] == pytest.approx(n["predicted_step_us"], rel=0.08)


def test_registers_set_two_programs_per_sm_as_recorded(rep: dict[str, object]) -> None:
    compiled = rep["compiled"]  # type: ignore[index]
    assert [c["by_registers"] for c in compiled] == [2, 2]
    assert min(c["by_shared_memory"] for c in compiled) == 3
    charge = ComponentTables(H200).deployment(1, 1, 0).charge_at(32, None)
    assert charge == LoadCharge("waves", 17.57, WaveGrid(132, 2, 2048, 768))


def test_waves_predict_the_probe_and_tiles_do_not(rep: dict[str, object]) -> None:
    for n in rep["per_N"].values():  # type: ignore[index]
        assert n["rms_us"]["waves"] < 3 and n["max_abs_error_pct"]["waves"] < 2.5
        assert n["rms_us"]["tiles"] > 4 * n["rms_us"]["waves"]
