"""bench/acquisition_forward_budget.py: the forwards a checkpoint's points issued, and why.

The counts follow the protocol (R16-R19): two forwards per checked weight set, per context
``warmup_cycles`` whole cycles of 2B sets in both arms, the recorded timed forwards, retries
counted apart; device seconds are the recorded times (and context medians for the untimed).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.acquisition_forward_budget import budget, load_phases, main, report


def _write(path: Path, records: list[dict[str, object]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def _samples(root: Path) -> Path:
    identity = {"protocol": {"warmup_cycles": 1, "local_warmup": 2, "rounds": 1}}
    records: list[dict[str, object]] = [
        {"type": "header", "identity": identity, "session": "s"},
        {"type": "reference_check", "point": "gate_routing:1", "slots": 1},
        {"type": "reference_check", "point": "experts:1:1:8", "slots": 4},
    ]
    for j, t in enumerate((7.0, 8.0, 9.0)):
        records.append({"type": "forward", "point": "gate_routing:1", "attempt": 0,
                        "arm": "local", "round": 0, "index": j, "time_us": t})  # fmt: skip
    records.append({"type": "context", "point": "gate_routing:1", "attempt": 0, "arm": "local",
                    "round": 0, "sets": 1, "forwards": 3})  # fmt: skip
    # experts with B = 2: both arms run 2B = 4 timed forwards after 4 warmup forwards; the
    # point's first attempt failed its control, so a second attempt ran both arms again.
    for attempt in (0, 1):
        for arm, sets in (("B", 2), ("2B", 4)):
            for j in range(4):
                records.append({"type": "forward", "point": "experts:1:1:8", "attempt": attempt,
                                "arm": arm, "round": 0, "index": j,
                                "time_us": 100.0 + j})  # fmt: skip
            records.append({"type": "context", "point": "experts:1:1:8", "attempt": attempt,
                            "arm": arm, "round": 0, "sets": sets, "forwards": 4})  # fmt: skip
    path = root / "_acquisition/H200/M/bf16/tp1/moe_components/dp1_ep1_rank0_sp0/samples.jsonl"
    return _write(path, records)


def test_it_counts_each_kind_of_forward_as_the_protocol_issues_it(tmp_path: Path) -> None:
    found = budget(_samples(tmp_path))
    assert found.target == "tp1/dp1_ep1_rank0_sp0"
    assert (found.points, found.expert_points, found.b_sets) == (2, 1, [2])
    # 1 local set and 4 expert sets, two forwards each (bank and reference, R19).
    assert found.forwards["reference"] == 2 * 1 + 2 * 4
    # local: 2 warmup; experts: 2 attempts x 2 arms x 1 cycle of 2B = 4 (R18: equal in both).
    assert found.forwards["warmup"] == 2 + 2 * 2 * 4
    assert found.forwards["timed"] == 3 + 2 * 2 * 4
    assert found.retry_forwards == 2 * (4 + 4)
    assert found.attempts == 3
    # Timed forwards at their recorded times; the untimed at their context's median.
    timed = (7 + 8 + 9) + 4 * (100 + 101 + 102 + 103)
    warmup = 2 * 8.0 + 4 * 4 * 101.5
    reference = 2 * 1 * 8.0 + 2 * 4 * 101.5
    assert found.device_s["timed"] == pytest.approx(timed / 1e6)
    assert found.device_s["warmup"] == pytest.approx(warmup / 1e6)
    assert found.device_s["reference"] == pytest.approx(reference / 1e6)


def test_it_divides_the_phases_by_the_forwards_and_states_the_goal(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    samples = _samples(tmp_path)
    seconds = {"build": 1.0, "reference_check": 0.010, "warmup": 0.018,
               "timed_forwards": 0.038, "profiler_toggle": 0.004, "profiler_stop": 0.002,
               "trace_collection": 0.003, "attribution": 0.001, "stimulus": 0.002,
               "publish": 0.5}  # fmt: skip
    record = {
        "type": "phases",
        "wall_s": 30.0,
        "command_line": "python -m acquisition slice M",
        "targets": {
            "run": {"seconds": {"process_start": 2.0, "admission": 16.0, "runtime_probe": 5.0}},
            "tp1/dp1_ep1_rank0_sp0": {"seconds": seconds},
        },
    }
    phases_path = _write(tmp_path / "phases.jsonl", [record])
    phases, wall = load_phases(phases_path)
    assert wall == 30.0
    text = report([budget(samples)], phases, wall, goal=1000, fixed_s=None)
    row = next(line for line in text.splitlines() if line.startswith("| tp1/") and "%" in line)
    cells = [c.strip() for c in row.strip("|").split("|")]
    # measuring: every phase but the start, builds and publishing
    assert float(cells[1]) == pytest.approx(0.078, abs=0.05)
    assert cells[3:7] == ["1.000", "1.000", "2.000", "0.526"]  # ms per reference/warmup/timed fw
    # The goal: 2 points at 1,000 a minute leave 0.12 s, less than the 24 s of fixed start.
    assert "after 24.0 s of fixed start" in text and "-23.9 s are left" in text
    assert main([str(tmp_path), "--phases", str(phases_path), "--fixed-s", "0.05"]) == 0
    assert "| **all** | 2 |" in capsys.readouterr().out


def test_it_times_each_fifth_of_the_first_session_from_the_write_stamps(tmp_path: Path) -> None:
    # Ten local contexts of 2 warmup + 3 timed forwards, written 0.5 s apart, then a resumed
    # session much later (ignored): the loop slows from 100 ms to 200 ms a forward.
    records: list[dict[str, object]] = [{"identity": {"protocol": {"local_warmup": 2}}}]
    at = 0.0
    for i in range(10):
        at += 0.5 if i < 6 else 1.0
        records.append({"type": "context", "point": f"gate_routing:{i}", "attempt": 0,
                        "arm": "local", "round": 0, "sets": 1, "forwards": 3, "at": at,
                        "session": "first"})  # fmt: skip
    records.append({"type": "context", "point": "gate_routing:9", "attempt": 1, "arm": "local",
                    "round": 0, "sets": 1, "forwards": 3, "at": at + 500, "session": "resumed"})  # fmt: skip
    path = _write(tmp_path / "tp1/moe_components/dp1_ep1_rank0_sp0/samples.jsonl", records)
    fifths = budget(path).fifths_ms
    # The first fifth runs from its first stamp (one gap of 0.5 s over its 10 forwards).
    assert fifths == pytest.approx([50.0, 100.0, 100.0, 200.0, 200.0])
