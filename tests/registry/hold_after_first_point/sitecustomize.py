"""Test-only: an acquisition that holds after its first measured point until it is signalled.

The worker tests (tests/registry/test_jobs_worker.py) cancel a running job, or kill its worker,
and need the acquisition to be certainly mid-measurement when that lands. On a CPU the tiny
model measures all its points well under a second after the first one, which is about what it
takes to see that point and act, so without a hold the outcome is a race. A worker started with
this folder on PYTHONPATH passes it to its acquisition subprocess, where Python imports this
module at start-up. It wraps `ProgressReporter.measured`: a run that has just measured its
first point and resumed none reports it, then sleeps for at most `HOLD_S` seconds; SIGTERM
interrupts the sleep through the acquisition's own handler (KeyboardInterrupt), so the run is
cancelled with that point kept, exactly as a cancel or a dying worker stops it anywhere else.
The measuring loop counts a batch's points inside `acquisition.deferred_stop.stop_deferred`
(a stop waits for the checkpoint and the count together), so the sleep happens as that section
ends, where a stop is delivered again, as it would be during the next batch's device work.
A resumed run does not hold. Nothing outside the tests puts this folder on PYTHONPATH.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.util
import sys
import time
from collections.abc import Sequence
from types import ModuleType
from typing import Any

HOLD_S = 120.0


_STATE = {"sections": 0, "pending": False}


def _hold() -> None:
    deadline = time.monotonic() + HOLD_S
    while time.monotonic() < deadline:
        time.sleep(0.05)


def _hold_after_first_point(reporter_class: Any) -> None:
    measured = reporter_class.measured

    def measured_then_hold(self: Any, seconds: float, message: str = "", **how: Any) -> None:
        measured(self, seconds, message, **how)
        # The first point of this run (a target's first batch counts as warm-up for the ETA).
        if self._measured + self._warm_measured == 1 and self.done == 1:
            self.event("measure", "held after the first point by the test hook")
            if _STATE["sections"]:
                _STATE["pending"] = True  # held as the deferred section ends
            else:
                _hold()

    reporter_class.measured = measured_then_hold


def _hold_after_the_section(module: ModuleType) -> None:
    section = module.stop_deferred

    @contextlib.contextmanager
    def stop_deferred_then_hold() -> Any:
        _STATE["sections"] += 1
        try:
            with section():
                yield
        finally:
            _STATE["sections"] -= 1
        if _STATE["pending"]:
            _STATE["pending"] = False
            _hold()

    module.stop_deferred = stop_deferred_then_hold


_PATCHES = {
    "acquisition.progress": lambda module: _hold_after_first_point(module.ProgressReporter),
    "acquisition.deferred_stop": _hold_after_the_section,
}


class _PatchProgressOnImport(importlib.abc.MetaPathFinder):
    def __init__(self) -> None:
        self.done: set[str] = set()

    def find_spec(
        self, name: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> Any:
        patch = _PATCHES.get(name)
        if patch is None or name in self.done:
            return None
        self.done.add(name)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_and_patch(module: ModuleType) -> None:
            exec_module(module)
            patch(module)

        spec.loader.exec_module = exec_and_patch  # type: ignore[method-assign]
        return spec


sys.meta_path.insert(0, _PatchProgressOnImport())
