"""Where a run's wall time goes: exclusive seconds per phase, per target (issue 19).

Device time is the scarcest resource of an acquisition, so the run can account for every
second of it: ``--phase-log PATH`` appends one JSON record per run with the seconds spent in
each phase (below), per target, the points measured and the whole wall time from the
process's start. ``bench/acquisition_phases.py`` prints the table.

Phases are *exclusive*: entering a nested phase stops the clock of the enclosing one, so the
phases of a run add up to its wall time (what no phase claims is ``other``). Reading the clock
costs two ``perf_counter`` calls per phase change; phases are entered per context or per
point, never per forward, so the clock changes nothing it measures.

An adapter may report sub-phases of its own build (engine start, ownership traces) through
``ComponentSession.build_phases`` (seconds by name); they are moved out of ``build``.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Iterator, Mapping

__all__ = ["PHASES", "PhaseClock", "process_start_time"]

# The vocabulary of the table, in the order a run meets it.
PHASES: dict[str, str] = {
    "process_start": "interpreter start and imports until the command line is parsed",
    "plan": "argument checks, catalog, point plans",
    "runtime_probe": "torch import, device initialisation, host observations",
    "admission": "adapter admission (imports vLLM and probes its API)",
    "build": "session construction per target (kernel, gate, router, weights)",
    "build.model_info": "vLLM's model-class inspection before the engine starts (live)",
    "build.engine_start": "the component engine's start (live)",
    "build.ownership_traces": "launch-ownership traces of native forwards (live)",
    "build.observations": "build-time zero-activity and native-apply traces (modular)",
    "build.conservation_traces": "traced forwards of the whole path for conservation.csv "
    "(modular, torch-reference)",
    "banks": "memory guard and weight-bank clones",
    "precompile": "Triton expert-kernel configurations compiled before the measuring loop "
    "(dry forwards, parallel where Triton allows)",
    "stimulus": "routing stimuli and device inputs of a point's weight sets",
    "reference_check": "every weight set (or local component) against its eager reference",
    "warmup": "untimed warmup forwards (profiler collection paused)",
    "timed_forwards": "timed forwards, each in its own profiler range",
    "profiler_start": "profiler session start",
    "profiler_toggle": "pausing and resuming collection around untimed work",
    "profiler_stop": "draining the device and stopping the profiler session",
    "trace_collection": "reading kineto events into a profiled window",
    "attribution": "launch-correlation attribution and its conservation checks",
    "statistics": "medians, the B/2B control and verdicts",
    "checkpoint": "samples.jsonl records, flush and fsync",
    "publish": "contract, coverage and the validated bundle write",
    "isolated_target": "a target's child process (--isolate-targets; the child logs its phases)",
    "other": "everything no phase above claims (progress, bookkeeping)",
}


def process_start_time() -> float | None:
    """This process's start as Unix seconds (Linux /proc), or None where unknown."""
    try:
        stat = Path("/proc/self/stat").read_text()
        ticks = int(stat.rsplit(")", 1)[1].split()[19])
        boot = next(
            float(line.split()[1])
            for line in Path("/proc/stat").read_text().splitlines()
            if line.startswith("btime ")
        )
    except (OSError, ValueError, IndexError, StopIteration):
        return None
    return boot + ticks / os.sysconf("SC_CLK_TCK")


class PhaseClock:
    """Exclusive wall seconds per phase and target; ``write`` appends the run's record."""

    def __init__(self, path: Path | None = None, *, whole_process: bool = False) -> None:
        """``whole_process``: the run is this process (a command line), so the time before
        the clock existed is booked as ``process_start``; not for calls inside a host process."""
        self.path = path
        self.whole_process = whole_process
        self.started = time.time()
        self._mark = time.perf_counter()
        self._stack: list[str] = ["other"]
        self._target = "run"
        self.seconds: dict[str, dict[str, float]] = {}
        self.counts: dict[str, dict[str, int]] = {}
        self.points: dict[str, int] = {}
        self.notes: dict[str, dict[str, Any]] = {}

    def _charge(self) -> None:
        now = time.perf_counter()
        table = self.seconds.setdefault(self._target, {})
        top = self._stack[-1]
        table[top] = table.get(top, 0.0) + (now - self._mark)
        self._mark = now

    def set_target(self, label: str) -> None:
        self._charge()
        self._target = label

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        if name not in PHASES:
            raise ValueError(f"unknown phase {name!r}")
        self._charge()
        self._stack.append(name)
        counts = self.counts.setdefault(self._target, {})
        counts[name] = counts.get(name, 0) + 1
        try:
            yield
        finally:
            self._charge()
            self._stack.pop()

    def move(self, source: str, parts: Mapping[str, float]) -> None:
        """Re-book seconds an adapter measured inside ``source`` under their own names."""
        table = self.seconds.setdefault(self._target, {})
        for name, seconds in parts.items():
            if name not in PHASES:
                raise ValueError(f"unknown phase {name!r}")
            moved = min(max(0.0, float(seconds)), table.get(source, 0.0))
            table[source] = table.get(source, 0.0) - moved
            table[name] = table.get(name, 0.0) + moved

    def note(self, name: str, value: Any) -> None:
        """Keep a JSON-able fact about the current target beside its seconds (e.g. what the
        precompilation compiled); the record carries it under ``notes``."""
        self.notes.setdefault(self._target, {})[name] = value

    def measured(self, count: int = 1) -> None:
        self.points[self._target] = self.points.get(self._target, 0) + count

    def record(self, **extra: Any) -> dict[str, Any]:
        self._charge()
        ended = time.time()
        begun = process_start_time() if self.whole_process else None
        targets: dict[str, dict[str, Any]] = {}
        for target, table in self.seconds.items():
            targets[target] = {
                "seconds": {k: round(v, 6) for k, v in table.items() if v > 0},
                "counts": self.counts.get(target, {}),
                "points": self.points.get(target, 0),
            }
            if target in self.notes:
                targets[target]["notes"] = self.notes[target]
        if begun is not None and begun <= self.started:
            # Before the clock existed: the interpreter, imports and argument parsing.
            run = targets.setdefault("run", {"seconds": {}, "counts": {}, "points": 0})
            run["seconds"]["process_start"] = round(self.started - begun, 6)
        return {
            "type": "phases",
            "schema": "acquisition-phases-v1",
            "process_started_at": begun,
            "clock_started_at": self.started,
            "ended_at": ended,
            "wall_s": round(ended - (begun if begun is not None else self.started), 6),
            "targets": targets,
            **extra,
        }

    def write(self, **extra: Any) -> dict[str, Any] | None:
        """Append the run's record to ``path`` (nothing without a path)."""
        if self.path is None:
            return None
        record = self.record(**extra)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a", encoding="utf-8") as handle:
            handle.write(json.dumps(record, sort_keys=True) + "\n")
        return record
