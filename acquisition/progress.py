"""Progress for a person (a tqdm bar) and for a worker (JSON lines, ``--progress-json``).

Each JSON line is one event: ``phase`` (validate, plan, admission, build, measure, publish,
done, failed, cancelled), ``points_done``, ``points_total``, ``eta_s`` (null until a point has
been measured in this run), ``message``, ``target`` and ``time``; ``done`` adds ``bundle``,
``failed`` adds ``error`` and, where kept, ``failures`` and ``trace``. Measure events are
rate-limited; phase changes are always written. Lines are flushed one by one so that a
follower (``tail -f``, a Celery task) sees them as they happen.
"""

from __future__ import annotations

import json
import sys
import time
from typing import IO, TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pathlib import Path

__all__ = ["ProgressReporter"]

_MEASURE_INTERVAL_S = 0.5


class ProgressReporter:
    def __init__(self, json_path: Path | None, *, bar: bool, total: int) -> None:
        self.total = total
        self.done = 0
        self._measured = 0
        self._measure_seconds = 0.0
        # Points whose seconds carry a target's start (its first batch: profiler start, first
        # kernel launches, a child process's build): the rate leaves them out once any
        # other point is measured, or the first ETA of every run reads several times too high.
        self._warm_measured = 0
        self._warm_seconds = 0.0
        self._last_event = 0.0
        self._target: str | None = None
        self._json: IO[str] | None = None
        if json_path is not None:
            json_path.parent.mkdir(parents=True, exist_ok=True)
            self._json = json_path.open("a", encoding="utf-8")
        self._bar: Any = None
        if bar:
            from tqdm import tqdm

            self._bar = tqdm(
                total=total, unit="pt", desc="points", file=sys.stderr, dynamic_ncols=True
            )

    @property
    def eta_s(self) -> float | None:
        left = self.total - self.done
        if self._measured:
            return self._measure_seconds / self._measured * left
        if self._warm_measured:
            return self._warm_seconds / self._warm_measured * left
        return None

    def set_target(self, target: str) -> None:
        self._target = target
        if self._bar is not None:
            self._bar.set_description(target)

    def event(self, phase: str, message: str = "", **extra: Any) -> None:
        self._last_event = time.monotonic()
        if self._json is None:
            return
        record = {
            "phase": phase,
            "points_done": self.done,
            "points_total": self.total,
            "eta_s": None if self.eta_s is None else round(self.eta_s, 1),
            "message": message,
            "target": self._target,
            "time": round(time.time(), 3),
            **extra,
        }
        self._json.write(json.dumps(record, default=str) + "\n")
        self._json.flush()

    def skipped(self, count: int) -> None:
        """Points already finished by an earlier run (resume)."""
        if count <= 0:
            return
        self.done += count
        if self._bar is not None:
            self._bar.update(count)
        self.event("measure", f"resumed: {count} points already measured")

    def measured(self, seconds: float, message: str = "", *, warm_up: bool = False) -> None:
        """One point decided in ``seconds``; ``warm_up``: measured in its target's first
        batch, whose seconds include the target's start (counted, but not in the rate while
        other points give one)."""
        self.done += 1
        if warm_up:
            self._warm_measured += 1
            self._warm_seconds += seconds
        else:
            self._measured += 1
            self._measure_seconds += seconds
        if self._bar is not None:
            self._bar.update(1)
        if time.monotonic() - self._last_event >= _MEASURE_INTERVAL_S or self.done == self.total:
            self.event("measure", message)

    def write(self, message: str) -> None:
        """A line for the person watching, above the bar."""
        if self._bar is not None:
            self._bar.write(message, file=sys.stderr)
        else:
            print(message, file=sys.stderr)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
        if self._json is not None:
            self._json.close()
