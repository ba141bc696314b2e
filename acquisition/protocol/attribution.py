"""Attributing profiled activities to timed ranges, with conservation checks (R15, R26).

Pure arithmetic over events already read from a profiler, so that it is tested without one.

- ``attribute_launches`` (CUDA): each device activity (kernel, memcpy, memset) belongs to the
  range that holds its host-side launch call, matched by the launch's correlation id. A
  range's time is the sum of its unique activities' durations: not their interval union,
  not elapsed time, no CPU time and no launch gaps.
- ``attribute_operators`` (CPU, where there is no device timeline): the outermost CPU
  operator events inside each range stand in for activities; nested operators are part of
  their parent and never counted again. Python time between operators is excluded.

Conservation: every activity of the window is owned by exactly one range or is unattributed,
and attributed + unattributed equals the window's total. A range with no activity, ranges
that overlap, an activity whose launch straddles a range edge, or launch calls in two ranges
claiming one correlation id are attribution failures, never silently resolved.
"""

from __future__ import annotations

import bisect
import itertools
from collections import defaultdict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

__all__ = [
    "Attribution",
    "AttributionError",
    "DeviceActivity",
    "HostCall",
    "ProfiledWindow",
    "TimedRange",
    "attribute_launches",
    "attribute_operators",
]


class AttributionError(RuntimeError):
    """The profile cannot be split into components without guessing.

    ``ranges`` names the timed ranges involved, where known (a batch of points shares one
    window, and the range names say which point failed).
    """

    def __init__(self, message: str, *, ranges: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.ranges = tuple(ranges)


@dataclass(frozen=True, slots=True)
class TimedRange:
    """A named host-side range (``record_function``) around one timed call."""

    name: str
    thread: int
    start_ns: int
    end_ns: int


@dataclass(frozen=True, slots=True)
class HostCall:
    """A host event: a CUDA runtime/driver call (a launch) or a CPU operator."""

    name: str
    thread: int
    start_ns: int
    end_ns: int
    correlation: int = 0


@dataclass(frozen=True, slots=True)
class DeviceActivity:
    """One native device activity and the correlation id of the call that launched it."""

    name: str
    start_ns: int
    duration_ns: int
    correlation: int
    stream: int = 0


@dataclass(slots=True)
class ProfiledWindow:
    ranges: list[TimedRange] = field(default_factory=list)
    launches: list[HostCall] = field(default_factory=list)
    activities: list[DeviceActivity] = field(default_factory=list)
    operators: list[HostCall] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Attribution:
    """Per-range sums (ns) and the window's conservation figures."""

    method: str
    per_range_ns: dict[str, int]
    per_range_count: dict[str, int]
    total_ns: int
    attributed_ns: int
    unattributed_ns: int
    unattributed_count: int

    def range_us(self, name: str) -> float:
        return self.per_range_ns[name] / 1000.0


class _RangeIndex:
    """Ranges per thread, checked to be disjoint, searchable by a timestamp."""

    def __init__(self, ranges: Sequence[TimedRange]) -> None:
        names = [r.name for r in ranges]
        if len(set(names)) != len(names):
            raise AttributionError("two timed ranges share a name")
        by_thread: dict[int, list[TimedRange]] = defaultdict(list)
        for r in ranges:
            if r.end_ns < r.start_ns:
                raise AttributionError(f"range {r.name} ends before it starts", ranges=[r.name])
            by_thread[r.thread].append(r)
        self._ranges: dict[int, list[TimedRange]] = {}
        self._starts: dict[int, list[int]] = {}
        for thread, items in by_thread.items():
            items.sort(key=lambda r: r.start_ns)
            for before, after in itertools.pairwise(items):
                if after.start_ns < before.end_ns:
                    raise AttributionError(
                        f"timed ranges {before.name} and {after.name} overlap on thread {thread}",
                        ranges=[before.name, after.name],
                    )
            self._ranges[thread] = items
            self._starts[thread] = [r.start_ns for r in items]

    def owner(
        self, thread: int, start_ns: int, end_ns: int, what: str, name: str, of: str = ""
    ) -> TimedRange | None:
        """The range holding [start, end] on ``thread``; the event is named in an error only
        (``what`` + ``name`` + " of " + ``of``), so no message is built per event."""
        starts = self._starts.get(thread)
        if not starts:
            return None
        i = bisect.bisect_right(starts, start_ns) - 1
        if i < 0:
            return None
        candidate = self._ranges[thread][i]
        if start_ns > candidate.end_ns:
            return None
        if end_ns > candidate.end_ns:
            event = f"{what}{name} of {of}" if of else f"{what}{name}"
            raise AttributionError(
                f"{event} starts inside {candidate.name} but ends after it", ranges=[candidate.name]
            )
        return candidate


def _unique(activities: Iterable[DeviceActivity]) -> list[DeviceActivity]:
    # A profiler can report one activity twice (two buffers, a flush); count it once (R15).
    return list(dict.fromkeys(activities))


def _finish(
    method: str,
    ranges: Sequence[TimedRange],
    owned: dict[str, list[int]],
    total: int,
    unattributed: list[int],
) -> Attribution:
    per_range = {r.name: sum(owned.get(r.name, ())) for r in ranges}
    counts = {r.name: len(owned.get(r.name, ())) for r in ranges}
    empty = [name for name, count in counts.items() if count == 0]
    if empty:
        raise AttributionError(
            f"{len(empty)} timed range(s) own no activity (first: {empty[0]}); "
            "the component's work was not captured or ran outside its range",
            ranges=empty,
        )
    attributed = sum(per_range.values())
    unowned = sum(unattributed)
    if attributed + unowned != total:
        raise AttributionError(
            f"conservation failed: attributed {attributed} ns + unattributed {unowned} ns "
            f"!= total {total} ns"
        )
    return Attribution(
        method=method,
        per_range_ns=per_range,
        per_range_count=counts,
        total_ns=total,
        attributed_ns=attributed,
        unattributed_ns=unowned,
        unattributed_count=len(unattributed),
    )


def attribute_launches(window: ProfiledWindow) -> Attribution:
    """Device activities to the ranges holding their launch calls (launch correlation)."""
    index = _RangeIndex(window.ranges)
    launches: dict[int, list[HostCall]] = defaultdict(list)
    for call in dict.fromkeys(window.launches):
        launches[call.correlation].append(call)
    activities = _unique(window.activities)
    total = sum(a.duration_ns for a in activities)
    owned: dict[str, list[int]] = defaultdict(list)
    unattributed: list[int] = []
    owner_of = index.owner
    for activity in activities:
        calls = launches.get(activity.correlation)
        if not calls:
            # Launched before the window opened, or by a call the window did not record.
            unattributed.append(activity.duration_ns)
            continue
        # A runtime call and the driver call beneath it may share one correlation id; they
        # must then agree on the owning range. (Most ids have one call: no set built.)
        owners = [
            owner_of(call.thread, call.start_ns, call.end_ns, "launch ", call.name, activity.name)
            for call in calls
        ]
        owner = owners[0]
        if any(other is not owner for other in owners[1:]):
            raise AttributionError(
                f"correlation id {activity.correlation} of {activity.name} is claimed by "
                f"launch calls in different ranges",
                ranges=sorted({o.name for o in owners if o is not None}),
            )
        if owner is None:
            # Launched outside every range.
            unattributed.append(activity.duration_ns)
        else:
            owned[owner.name].append(activity.duration_ns)
    return _finish("launch_correlation", window.ranges, owned, total, unattributed)


def attribute_operators(window: ProfiledWindow) -> Attribution:
    """Outermost CPU operators to the ranges that contain them (CPU timing)."""
    index = _RangeIndex(window.ranges)
    by_thread: dict[int, list[HostCall]] = defaultdict(list)
    for op in dict.fromkeys(window.operators):
        by_thread[op.thread].append(op)
    owned: dict[str, list[int]] = defaultdict(list)
    unattributed: list[int] = []
    total = 0
    for thread, ops in by_thread.items():
        ops.sort(key=lambda op: (op.start_ns, -op.end_ns))
        outer_end = -1
        for op in ops:
            if op.start_ns < outer_end:
                if op.end_ns > outer_end:
                    raise AttributionError(
                        f"operator {op.name} on thread {thread} overlaps its parent without nesting"
                    )
                continue  # nested: already inside its outermost parent's duration
            outer_end = op.end_ns
            duration = op.end_ns - op.start_ns
            total += duration
            owner = index.owner(thread, op.start_ns, op.end_ns, "operator ", op.name)
            if owner is None:
                unattributed.append(duration)
            else:
                owned[owner.name].append(duration)
    return _finish("cpu_operator_events", window.ranges, owned, total, unattributed)
