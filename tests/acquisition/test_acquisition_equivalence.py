"""The equivalence check of a fast acquisition against a shipped bundle (issue 19).

A table measured the fast way must agree with the shipped one point by point: median change
<= 1 %, the same weight sets, every common point published (R16-R18's answers unchanged).
"""

from __future__ import annotations

import importlib.util
import json
import sys
import tarfile
from pathlib import Path
from types import ModuleType

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
REST = Path("Qwen/Qwen3-30B-A3B-Instruct-2507/bf16/tp1/moe_components/dp1_ep1_rank0_sp0")


def module(name: str) -> ModuleType:
    sys.path.insert(0, str(BENCH))
    try:
        spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
        assert spec is not None and spec.loader is not None
        loaded = importlib.util.module_from_spec(spec)
        sys.modules[name] = loaded  # dataclasses look their module up while being built
        spec.loader.exec_module(loaded)
        return loaded
    finally:
        sys.path.remove(str(BENCH))


def write_tables(where: Path, scale: float, sets: int = 4) -> None:
    where.mkdir(parents=True, exist_ok=True)
    rows = ["component,mode,tokens,activated_experts,local_assignments,time_us"]
    rows += [f"experts,eager,{n},1,{n},{10.0 * n * scale:.4f}" for n in (1, 2, 4, 8)]
    (where / "components.csv").write_text("\n".join(rows) + "\n")


def write_samples(where: Path, sets: int = 4) -> None:
    where.mkdir(parents=True, exist_ok=True)
    records = []
    for n in (1, 2, 4, 8):
        key = f"experts:{n}:1:{n}"
        records.append({"type": "control", "point": key, "attempt": 0, "passed": True,
                        "sets": [sets // 2, sets]})  # fmt: skip
        records.append({"type": "point", "point": key, "status": "measured"})
    (where / "samples.jsonl").write_text("\n".join(json.dumps(r) for r in records) + "\n")


def bundle(root: Path) -> Path:
    """A shipped bundle's layout: tables under MODEL/VARIANT, samples in a tarball."""
    write_tables(root / REST, 1.0)
    staged = root.parent / "staged"
    write_samples(staged / "out/_acquisition/H200" / REST)
    archive = root / "Qwen/Qwen3-30B-A3B-Instruct-2507/bf16.acquisition-samples.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(staged / "out", arcname="out")
    return root


def out_root(root: Path, scale: float, sets: int = 4) -> Path:
    write_tables(root / "H200" / REST, scale)
    write_samples(root / "_acquisition/H200" / REST, sets)
    return root


@pytest.mark.parametrize(
    ("scale", "sets", "code", "verdict"),
    [(1.005, 4, 0, "AGREE"), (1.02, 4, 1, "DIFFER"), (1.0, 6, 1, "DIFFER")],
)
def test_a_run_is_checked_against_a_shipped_bundle(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], scale: float, sets: int, code: int,
    verdict: str,
) -> None:  # fmt: skip
    equivalence = module("acquisition_equivalence")
    shipped = bundle(tmp_path / "bundle")
    run = out_root(tmp_path / "run", scale, sets)
    assert equivalence.main([str(shipped), str(run), "--check"]) == code
    printed = capsys.readouterr().out
    assert f"verdict: {verdict}" in printed
    assert "| dp1_ep1_rank0_sp0 | 4 |" in printed


def test_the_summary_pairs_runs_with_bundles_and_with_their_before(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    summary = module("acquisition_speed_summary")
    shipped = bundle(tmp_path / "bundle")
    runs = tmp_path / "runs"
    record = {"type": "phases", "wall_s": 60.0, "points_total": 4, "exit_status": 0,
              "targets": {"t": {"seconds": {"timed_forwards": 30.0}, "points": 4}}}  # fmt: skip
    for label, scale in (("before-modular-f2", 1.0), ("after-modular-f2", 1.03)):
        out_root(runs / label / "out", scale)
        (runs / label / "phases.jsonl").write_text(json.dumps(record) + "\n")
    code = summary.main([str(runs), "--baseline", f"modular={shipped}"])
    printed = capsys.readouterr().out
    assert "| **points per minute** | **4** |  | **4** |  |" in printed
    assert "### after-modular-f2 against before-modular-f2" in printed
    assert printed.count("verdict: DIFFER") == 2  # the after run, against both
    assert code == 1


def test_an_isolated_command_counts_once_in_the_phase_table(tmp_path: Path) -> None:
    """--isolate-targets: the children's records sit inside the parent's wall (issue 19)."""
    phases = module("acquisition_phases")
    records = []
    for key, wall in (("tp1/dp2_ep2_rank0_sp0", 50.0), ("tp1/dp2_ep2_rank1_sp0", 60.0)):
        records.append({"type": "phases", "wall_s": wall, "exit_status": 0,
                        "command_line": f"python -m acquisition --only-target {key} --dp 2",
                        "targets": {key: {"seconds": {"timed_forwards": 40.0}, "points": 10},
                                    "run": {"seconds": {"process_start": 2.0}, "points": 0}}})  # fmt: skip
    records.append({"type": "phases", "wall_s": 115.0, "exit_status": 0, "points_total": 20,
                    "command_line": "python -m acquisition --dp 2",
                    "targets": {"tp1/dp2_ep2_rank0_sp0": {"seconds": {"isolated_target": 51.0}},
                                "tp1/dp2_ep2_rank1_sp0": {"seconds": {"isolated_target": 62.0}},
                                "run": {"seconds": {"plan": 1.0}}}})  # fmt: skip
    log = tmp_path / "phases.jsonl"
    log.write_text("".join(json.dumps(r) + "\n" for r in records))
    run = phases.load(log, "isolated")
    assert run.wall_s == 115.0 and run.points == 20
    assert run.seconds["isolated_target"] == 3.0  # spawning and relaying only
    assert run.seconds["timed_forwards"] == 80.0 and run.seconds["process_start"] == 4.0
    assert run.exit_status == [0]
    assert sum(run.seconds.values()) <= run.wall_s
    # Once started: without process starts, planning and spawning (8 s of the 115 s).
    assert run.measuring_points_per_minute == pytest.approx(20 / 107 * 60)
