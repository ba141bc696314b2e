"""A failed B/2B control is retried at the end of the target's queue (R9, R18; issue 19).

On the H200 a point whose first control failed, re-measured at once, often failed again, and a
rerun in a new process then measured it fine: its attempts were correlated in time. So a failed
attempt's point goes to the end of the queue, after the points not yet measured; the verdict
rules, ``--control-attempts`` per run and the failure message are unchanged, and a kill at any
moment between attempts resumes to the same verdicts and attempt numbers.

The failures are injected (``retry_fakes.py``): the chosen attempts' 2B times come back four
times longer, which fails the pooled-median control; every other time is measured on the CPU.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from retry_fakes import fail_controls

from acquisition.cli import build_parser, main, prepare
from moetables.bundle import validate_bundle

pytest.importorskip("torch")

REPO = Path(__file__).resolve().parents[2]
DEPLOYMENT = "dp2_ep2_rank0_sp0"
COMMON = [
    "--hardware", "CPU", "--tp", "1", "--tp-refresh", "1", "--dp", "2", "--ep", "2",
    "--ranks", "0", "--max-num-seqs", "2", "--max-num-batched-tokens", "2",
    "--moe-rounds", "2", "--measurement-iterations", "1", "--warmup-cycles", "0",
    "--backend", "torch-reference", "--device", "cpu", "--cache-bytes", "1",
    "--quality-tolerance", "0.9", "--cudagraph-mode", "NONE", "--no-progress-bar",
    "--profile-batch", "2",
]  # fmt: skip


def argv(model: Path, out: Path, *extra: str) -> list[str]:
    return ["slice", str(model), *COMMON, "--out-root", str(out), *extra]


def expert_keys(model: Path, out: Path) -> list[str]:
    """The target's expert points in plan order."""
    args = argv(model, out)
    _, plans = prepare(build_parser().parse_args(args), args)
    return [p.key for p in plans[0].points if p.is_expert]


def work(out: Path) -> Path:
    return out / "_acquisition/CPU/test/tiny-moe/fp32/tp1/moe_components" / DEPLOYMENT


def records(out: Path) -> list[dict[str, Any]]:
    lines = (work(out) / "samples.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def attempts_in_order(recs: list[dict[str, Any]]) -> list[tuple[str, int]]:
    """(point, attempt) as their contexts were written: the measuring order."""
    order: list[tuple[str, int]] = []
    for r in recs:
        if r["type"] == "context" and (r["point"], r["attempt"]) not in order:
            order.append((r["point"], r["attempt"]))
    return order


def controls(recs: list[dict[str, Any]], point: str) -> list[tuple[int, bool]]:
    return [
        (r["attempt"], r["passed"]) for r in recs if r["type"] == "control" and r["point"] == point
    ]


def verdicts(recs: list[dict[str, Any]]) -> dict[str, tuple[str, int]]:
    return {r["point"]: (r["status"], r["attempt"]) for r in recs if r["type"] == "point"}


def test_a_failed_control_is_retried_after_the_other_points_and_publishes(
    tiny_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "out"
    chosen = expert_keys(tiny_model, out)[0]
    fail_controls({chosen: (0,)}, monkeypatch.setattr)
    progress = tmp_path / "progress.jsonl"
    assert main([*argv(tiny_model, out), "--progress-json", str(progress)]) == 0

    recs = records(out)
    order = attempts_in_order(recs)
    # Every other point's first attempt ran before the chosen point's retry (R18's check failed
    # at attempt 0; the retry went to the end of the queue, not back to its head).
    assert order.index((chosen, 1)) == len(order) - 1
    assert {p for p, _ in order} == {p for p, a in order if a == 0}
    # It was measured early (the first expert point), so a retry at the head would have run
    # before most of the others: the assertion above can fail.
    assert order.index((chosen, 0)) < len(order) // 2
    # The verdict rules: attempt 0 failed (2B injected x20), attempt 1 passed and is published.
    assert controls(recs, chosen) == [(0, False), (1, True)]
    failed = next(r for r in recs if r["type"] == "control" and r["point"] == chosen)
    # Failed by the injected change, past the tolerance (--quality-tolerance 0.9). Not x20 - 1
    # exactly: B is one CPU forward here, and on a loaded machine one slow B forward was seen
    # to bring 3.0 down to 1.2 (CI, session 11).
    assert failed["relative_change"] > 0.9
    assert verdicts(recs)[chosen] == ("measured", 1)
    assert all(v == ("measured", 0) for k, v in verdicts(recs).items() if k != chosen)
    bundle = out / "CPU/test/tiny-moe/fp32"
    assert validate_bundle(bundle).ok
    # Progress: one count per point at its verdict, never past the total, ending at it.
    events = [json.loads(line) for line in progress.read_text().splitlines()]
    done = [e["points_done"] for e in events]
    assert done == sorted(done) and events[-1]["points_done"] == events[-1]["points_total"]
    assert events[-1]["points_total"] == len(verdicts(recs))


def test_points_failing_every_attempt_fail_the_run_and_their_retries_interleave(
    tiny_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    out = tmp_path / "out"
    keys = expert_keys(tiny_model, out)
    first, second = keys[0], keys[5]
    fail_controls({first: (0, 1, 2), second: (0, 1, 2)}, monkeypatch.setattr)
    assert main(argv(tiny_model, out, "--control-attempts", "3")) == 1
    # The message of a run whose points failed their attempts is unchanged.
    err = capsys.readouterr().err
    assert (
        "2 expert points failed the stability control after 3 attempts "
        f"(first: {DEPLOYMENT} {first}); nothing was published" in err
    )
    assert not (out / "CPU").exists()
    recs = records(out)
    for key in (first, second):
        assert controls(recs, key) == [(0, False), (1, False), (2, False)]
        assert verdicts(recs)[key] == ("failed", 2)
    # Once only retries remain the queue sweeps them in turn: attempts 1 and 2 alternate.
    order = attempts_in_order(recs)
    tail = [(p, a) for p, a in order if a > 0]
    assert order[-len(tail) :] == tail
    assert tail == [(first, 1), (second, 1), (first, 2), (second, 2)]


def _child(spec: dict[str, Any], args: list[str]) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    here = str(Path(__file__).parent)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), here, env.get("PYTHONPATH", "")])
    return subprocess.run(
        [sys.executable, str(Path(here) / "retry_fakes.py"), json.dumps(spec), *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )


@pytest.mark.parametrize(
    "moment",
    [
        "after_the_failed_control",  # the retry waits at the end of the killed run's queue
        "after_the_retry_s_contexts",  # its contexts are written, its control is not
        "after_the_retry_s_passed_control",  # the control is written, the verdict is not
    ],
)
def test_a_kill_between_attempts_resumes_to_the_same_verdicts(
    tiny_model: Path, tmp_path: Path, moment: str
) -> None:
    out = tmp_path / "out"
    chosen = expert_keys(tiny_model, out)[0]
    kill = {
        "after_the_failed_control": {"type": "control", "point": chosen, "attempt": 0},
        "after_the_retry_s_contexts": {"type": "context", "point": chosen, "attempt": 1},
        "after_the_retry_s_passed_control": {"type": "control", "point": chosen, "attempt": 1},
    }[moment]
    args = argv(tiny_model, out)
    killed = _child({"fail": {chosen: [0]}, "kill": kill}, args)
    assert killed.returncode == -9, killed.stderr
    before = records(out)
    kept = {r["point"]: r["time_us"] for r in before if r["type"] == "point"}
    assert chosen not in kept

    resumed = _child({"fail": {chosen: [0]}}, args)  # attempt 0 is decided already
    assert resumed.returncode == 0, resumed.stderr
    recs = records(out)
    # The same verdicts and attempt numbers as a run that was not killed.
    assert controls(recs, chosen) == [(0, False), (1, True)]
    assert verdicts(recs)[chosen] == ("measured", 1)
    assert all(v == ("measured", 0) for k, v in verdicts(recs).items() if k != chosen)
    assert not [r for r in recs if r.get("point") == chosen and r.get("attempt", 0) > 1]
    # What was measured before the kill is kept, not measured again.
    for key, time_us in kept.items():
        assert [r["time_us"] for r in recs if r["type"] == "point" and r["point"] == key] == [
            time_us
        ]
    # The resumed run's measuring order: the retry waiting in the killed run's queue runs
    # after the points not yet measured; a retry whose contexts were written is read back.
    session = recs[len(before)]["session"]
    order = attempts_in_order([r for r in recs if r["session"] == session])
    if moment == "after_the_failed_control":
        assert len(order) > 1 and order[-1] == (chosen, 1)
        assert {p for p, _ in order[:-1]} == {p for p, a in order[:-1] if a == 0}
    else:
        assert chosen not in {p for p, _ in order}
    assert validate_bundle(out / "CPU/test/tiny-moe/fp32").ok


def test_the_default_gives_a_point_the_attempts_a_rerun_would_in_one_process(
    tiny_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Six attempts per run by default (session 8): on the H200, rank-1 points whose first
    three attempts failed passed at the rerun's first, after a 25 s restart of the process; the
    same attempts now run in the first process. The point passes at attempt 3 and publishes."""
    out = tmp_path / "out"
    chosen = expert_keys(tiny_model, out)[0]
    fail_controls({chosen: (0, 1, 2)}, monkeypatch.setattr)
    assert main(argv(tiny_model, out)) == 0
    recs = records(out)
    assert controls(recs, chosen) == [(0, False), (1, False), (2, False), (3, True)]
    assert verdicts(recs)[chosen] == ("measured", 3)
    assert validate_bundle(out / "CPU/test/tiny-moe/fp32").ok
