"""The phase table of a run (issue 19): where an acquisition's wall time goes.

R9 and R36 are untouched by it: the clock only reads ``perf_counter`` around phases; the
samples, plan and bundle of a run with ``--phase-log`` are those of a run without it.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from tiny_moe import write_model

from acquisition.cli import main
from acquisition.phases import PHASES, PhaseClock

torch = pytest.importorskip("torch")

COMMON = [
    "--hardware", "CPU", "--tp", "1", "--tp-refresh", "1", "--max-num-seqs", "2",
    "--max-num-batched-tokens", "2", "--moe-rounds", "2", "--measurement-iterations", "1",
    "--warmup-cycles", "0", "--backend", "torch-reference", "--device", "cpu",
    "--cache-bytes", "1", "--quality-tolerance", "0.9", "--cudagraph-mode", "NONE",
    "--no-progress-bar",
]  # fmt: skip


def test_it_books_nested_phases_exclusively(monkeypatch: pytest.MonkeyPatch) -> None:
    # A scripted perf_counter: exact seconds whatever the machine's load.
    now = [100.0]
    monkeypatch.setattr("acquisition.phases.time.perf_counter", lambda: now[0])
    monkeypatch.setattr("acquisition.phases.time.time", lambda: now[0])
    clock = PhaseClock()
    clock.set_target("t")
    with clock.phase("build"):
        now[0] += 0.02
        with clock.phase("build.engine_start"):
            now[0] += 0.03
    seconds = clock.seconds["t"]
    assert seconds["build"] == pytest.approx(0.02)  # the nested phase's time is not counted twice
    assert seconds["build.engine_start"] == pytest.approx(0.03)
    record = clock.record()
    total = sum(sum(t["seconds"].values()) for t in record["targets"].values())
    assert total == pytest.approx(record["wall_s"], abs=1e-6)


def test_it_moves_adapter_sub_phases_out_of_build_and_rejects_unknown_names() -> None:
    clock = PhaseClock()
    with clock.phase("build"):
        time.sleep(0.02)
    clock.move("build", {"build.ownership_traces": 0.015, "build.engine_start": 5.0})
    seconds = clock.seconds["run"]
    assert seconds["build.ownership_traces"] == pytest.approx(0.015)
    # Never more than the enclosing phase held: a sub-phase cannot create time.
    assert seconds["build"] == pytest.approx(0.0, abs=1e-9)
    with pytest.raises(ValueError, match="unknown phase"), clock.phase("coffee"):
        pass


def test_a_run_writes_one_record_whose_phases_add_up_to_its_wall_time(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = write_model(tmp_path / "tiny-moe")
    log = tmp_path / "phases.jsonl"
    args = ["slice", str(model), *COMMON, "--out-root", str(tmp_path / "out")]
    assert main([*args, "--phase-log", str(log)]) == 0
    (record,) = [json.loads(line) for line in log.read_text().splitlines()]
    assert record["exit_status"] == 0 and record["points_done"] == record["points_total"] > 0
    target = record["targets"]["tp1/dp1_ep1_rank0_sp0"]
    assert target["points"] == record["points_total"]
    for phase in ("build", "reference_check", "timed_forwards", "profiler_start", "attribution",
                  "trace_collection", "checkpoint", "publish"):  # fmt: skip
        assert target["seconds"].get(phase, 0) > 0, phase
    assert set(target["seconds"]) <= set(PHASES)
    booked = sum(sum(t["seconds"].values()) for t in record["targets"].values())
    # Everything from the process start to the bundle is booked somewhere.
    assert booked == pytest.approx(record["wall_s"], rel=0.02, abs=0.05)

    # The bench script reads it back; a resumed (no-op) run adds a second record.
    assert main([*args, "--phase-log", str(log)]) == 0
    from bench.acquisition_phases import load

    run = load(log, "x")
    assert run.points == record["points_total"]  # the rerun measured nothing new
    assert run.exit_status == [0, 0] and run.wall_s > record["wall_s"]
    capsys.readouterr()
