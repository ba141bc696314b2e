"""The ETA of a run (R9's progress): a target's first batch, whose seconds carry the target's
start, does not set the rate once other points give one."""

from __future__ import annotations

import json
from pathlib import Path

from acquisition.progress import ProgressReporter


def test_the_rate_leaves_out_the_first_batch_once_later_points_exist(tmp_path: Path) -> None:
    path = tmp_path / "progress.jsonl"
    progress = ProgressReporter(path, bar=False, total=40)
    assert progress.eta_s is None
    for _ in range(8):  # the first batch: 10 s a point, start included
        progress.measured(10.0, warm_up=True)
    assert progress.eta_s == 10.0 * 32  # nothing better known yet
    for _ in range(8):
        progress.measured(0.5)
    assert progress.eta_s == 0.5 * 24
    progress.skipped(4)  # resumed points shorten what is left, not the rate
    assert progress.eta_s == 0.5 * 20
    for _ in range(8):  # the next target's first batch does not move it either
        progress.measured(7.0, warm_up=True)
    assert progress.eta_s == 0.5 * 12
    progress.event("measure")
    progress.close()
    last = json.loads(path.read_text().splitlines()[-1])
    assert (last["points_done"], last["eta_s"]) == (28, 6.0)


def test_a_child_feeds_its_first_points_as_warm_up() -> None:
    from acquisition.cli import _ChildFeed

    progress = ProgressReporter(None, bar=False, total=20)
    feed = _ChildFeed(progress, 20)
    feed.last -= 30.0  # the child's start and build before its first event
    feed.feed({"phase": "measure", "points_done": 8, "points_total": 20, "message": ""})
    first = progress.eta_s
    assert first is not None and first > 30.0 / 8 * 12 * 0.9
    feed.feed({"phase": "measure", "points_done": 16, "points_total": 20, "message": ""})
    assert progress.eta_s is not None and progress.eta_s < first / 100
