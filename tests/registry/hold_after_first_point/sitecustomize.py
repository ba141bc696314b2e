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
A resumed run does not hold. Nothing outside the tests puts this folder on PYTHONPATH.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
import time
from collections.abc import Sequence
from types import ModuleType
from typing import Any

HOLD_S = 120.0


def _hold_after_first_point(reporter_class: Any) -> None:
    measured = reporter_class.measured

    def measured_then_hold(self: Any, seconds: float, message: str = "") -> None:
        measured(self, seconds, message)
        if self._measured == 1 and self.done == 1:
            self.event("measure", "held after the first point by the test hook")
            deadline = time.monotonic() + HOLD_S
            while time.monotonic() < deadline:
                time.sleep(0.05)

    reporter_class.measured = measured_then_hold


class _PatchProgressOnImport(importlib.abc.MetaPathFinder):
    def find_spec(
        self, name: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> Any:
        if name != "acquisition.progress":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_and_patch(module: ModuleType) -> None:
            exec_module(module)
            _hold_after_first_point(module.ProgressReporter)

        spec.loader.exec_module = exec_and_patch  # type: ignore[method-assign]
        return spec


sys.meta_path.insert(0, _PatchProgressOnImport())
