"""samples.jsonl: append, replay, repair, identity and the writer lock (R9, R36)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from acquisition.protocol.samples import (
    SAMPLES,
    CheckpointError,
    SampleLog,
    append_failure,
    writer_lock,
)

IDENTITY = {"model": "m", "plan": "abc", "rounds": 2}


def forwards(point: str, attempt: int, arm: str, round_: int, times: list[float]) -> list[dict]:
    records = [
        {
            "type": "forward",
            "point": point,
            "attempt": attempt,
            "arm": arm,
            "round": round_,
            "index": i,
            "time_us": t,
        }
        for i, t in enumerate(times)
    ]
    records.append(
        {
            "type": "context",
            "point": point,
            "attempt": attempt,
            "arm": arm,
            "round": round_,
            "forwards": len(times),
            "banks": 2,
        }
    )
    return records


def test_a_reopened_log_resumes_closed_contexts_and_verdicts(tmp_path: Path) -> None:
    log = SampleLog.open(tmp_path, IDENTITY, {"torch": "a"})
    log.extend(forwards("gate:1", 0, "local", 0, [1.0, 2.0]))
    log.extend(forwards("gate:1", 0, "local", 1, [3.0, 4.0]))
    log.append(
        {"type": "point", "point": "gate:1", "attempt": 0, "status": "measured", "time_us": 2.5}
    )
    log.extend(forwards("experts:2:1:2", 0, "B", 0, [5.0])[:-1])  # no closing record
    log.close()
    again = SampleLog.open(tmp_path, IDENTITY, {"torch": "b"})
    assert again.state("gate:1").measured and again.state("gate:1").time_us == 2.5
    pending = again.state("experts:2:1:2")
    attempt, state = pending.open_attempt()
    assert attempt == 0 and state.contexts == {}  # an unclosed context does not count
    assert [s["observations"]["torch"] for s in again.sessions] == ["a", "b"]
    assert again.productive_sessions == [log.session]
    again.close()


def test_an_incomplete_trailing_line_is_archived_before_repair(tmp_path: Path) -> None:
    log = SampleLog.open(tmp_path, IDENTITY, {})
    log.extend(forwards("gate:1", 0, "local", 0, [1.0]))
    log.close()
    with (tmp_path / SAMPLES).open("a") as handle:
        handle.write('{"type": "forward", "point": "gate:1", "ti')  # killed mid-write
    again = SampleLog.open(tmp_path, IDENTITY, {})
    assert again.archived is not None
    assert again.archived.read_text() == '{"type": "forward", "point": "gate:1", "ti'
    assert again.state("gate:1").attempts[0].contexts[("local", 0)] == [1.0]
    again.close()
    lines = (tmp_path / SAMPLES).read_text().splitlines()
    assert all(json.loads(line) for line in lines)  # whole records only after repair


def test_a_malformed_complete_record_is_rejected(tmp_path: Path) -> None:
    SampleLog.open(tmp_path, IDENTITY, {}).close()
    with (tmp_path / SAMPLES).open("a") as handle:
        handle.write("not json\n")
    with pytest.raises(CheckpointError, match=r"samples.jsonl:2: malformed record"):
        SampleLog.open(tmp_path, IDENTITY, {})


def test_other_semantic_conditions_need_another_out_root(tmp_path: Path) -> None:
    SampleLog.open(tmp_path, IDENTITY, {}).close()
    with pytest.raises(CheckpointError, match=r"changed: rounds.*another --out-root"):
        SampleLog.open(tmp_path, {**IDENTITY, "rounds": 3}, {})


def test_changed_observations_alone_keep_the_resume_identity(tmp_path: Path) -> None:
    """R36: a new torch version is an observation of the new session, not another contract:
    the log reopens and resumes what the first session measured."""
    log = SampleLog.open(tmp_path, IDENTITY, {"torch_version": "2.11"})
    log.append(
        {"type": "point", "point": "gate:1", "attempt": 0, "status": "measured", "time_us": 2.5}
    )
    log.close()
    again = SampleLog.open(tmp_path, IDENTITY, {"torch_version": "2.13"})
    assert again.state("gate:1").measured and again.state("gate:1").time_us == 2.5
    assert [s["observations"]["torch_version"] for s in again.sessions] == ["2.11", "2.13"]
    assert {json.dumps(s["identity"], sort_keys=True) for s in again.sessions} == {
        json.dumps(IDENTITY, sort_keys=True)
    }
    again.close()


def test_one_writer_per_target(tmp_path: Path) -> None:
    with (
        writer_lock(tmp_path),
        pytest.raises(CheckpointError, match=r"writer\.lock"),
        writer_lock(tmp_path),
    ):
        pass
    with writer_lock(tmp_path):  # released on exit
        pass


def test_a_failed_control_opens_a_new_attempt(tmp_path: Path) -> None:
    log = SampleLog.open(tmp_path, IDENTITY, {})
    log.append(
        {
            "type": "control",
            "point": "experts:1:1:1",
            "attempt": 0,
            "passed": False,
            "relative_change": 0.2,
        }
    )
    attempt, _ = log.state("experts:1:1:1").open_attempt()
    assert attempt == 1
    log.close()


def test_failures_go_to_their_own_file(tmp_path: Path) -> None:
    append_failure(tmp_path, {"point": "experts:1:1:1", "reason": "attribution failed"})
    assert json.loads((tmp_path / "failures.jsonl").read_text())["reason"] == "attribution failed"


def test_a_refused_resume_names_the_changed_option_and_its_values(tmp_path: Path) -> None:
    """A user's pass: --moe-rounds, --measurement-iterations, --quality-tolerance all said
    "changed: protocol", and a changed plan only "point_plan_sha256"."""
    first = {**IDENTITY, "protocol": {"rounds": 2, "iterations": 3}, "point_plan_sha256": "a" * 64}
    SampleLog.open(tmp_path, first, {}).close()
    again = {**first, "protocol": {"rounds": 3, "iterations": 3}, "point_plan_sha256": "b" * 64}
    with pytest.raises(CheckpointError) as refused:
        SampleLog.open(tmp_path, again, {})
    message = str(refused.value)
    assert "protocol.rounds (2 -> 3)" in message and "iterations" not in message
    assert "point_plan_sha256 (the point plan: grid factor" in message


def test_a_resume_is_checked_before_the_build_on_the_fields_known_then(tmp_path: Path) -> None:
    """`check_resumable` compares what is known before the build (no bank count yet): a
    changed field is refused by name; the fields it is not given are left to `open`."""
    first = {**IDENTITY, "banks": 4}
    SampleLog.open(tmp_path, first, {}).close()
    SampleLog.check_resumable(tmp_path, IDENTITY)  # the same command: no refusal
    with pytest.raises(CheckpointError, match=r"changed: rounds \(2 -> 3\).*another --out-root"):
        SampleLog.check_resumable(tmp_path, {**IDENTITY, "rounds": 3})
    with pytest.raises(CheckpointError, match=r"changed: device \(null -> \"cuda\"\)"):
        SampleLog.check_resumable(tmp_path, {**IDENTITY, "device": "cuda"})
    SampleLog.check_resumable(tmp_path / "elsewhere", IDENTITY)  # nothing to resume
