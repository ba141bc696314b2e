"""Launch ownership inside one native forward: which nested scope launched each activity.

The protocol times each component in its own range. The adapters additionally need two
checks that the protocol does not make, both outside every timed range:

- *zero activity* (modular DP1, R22): the admitted no-op prepare and finalize launch nothing;
- *launch ownership and conservation* (live path, R26): in one native parent MoE forward with
  its gate/router and routed-kernel calls marked as nested scopes, every device activity
  belongs to exactly one innermost scope (or to the parent's own remainder, the wrapper), and
  the scope sums add up to the parent's total. No activity is counted in two components.

``nested_ownership`` is pure arithmetic over a ``ProfiledWindow`` so that it is tested without
a profiler; ``trace`` runs a callable under the protocol's ``ProfilerCapture`` (CUDA only).
"""

from __future__ import annotations

import bisect
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from acquisition.protocol.attribution import AttributionError, ProfiledWindow, TimedRange

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

__all__ = ["ScopeOwnership", "launched_activity_names", "nested_ownership", "trace"]


@dataclass(frozen=True, slots=True)
class ScopeOwnership:
    """Activities per innermost scope of one traced call, and the conservation figures."""

    per_scope_ns: dict[str, int]
    per_scope_names: dict[str, list[str]]
    total_ns: int
    outside_ns: int
    outside_names: list[str] = field(default_factory=list)
    # Device streams each scope's activities ran on: a shared expert that vLLM puts on its
    # side stream shows up here (the table still stores serial sums, R15).
    per_scope_streams: dict[str, list[int]] = field(default_factory=dict)

    def count(self, scope: str) -> int:
        return len(self.per_scope_names.get(scope, ()))

    def as_dict(self) -> dict[str, Any]:
        return {
            "per_scope_us": {k: v / 1000.0 for k, v in sorted(self.per_scope_ns.items())},
            "per_scope_activities": {
                k: dict(Counter(v)) for k, v in sorted(self.per_scope_names.items())
            },
            "total_us": self.total_ns / 1000.0,
            "outside_us": self.outside_ns / 1000.0,
        }


def _innermost(ranges: Sequence[TimedRange], starts: list[int], t0: int, t1: int) -> str | None:
    """The innermost range holding [t0, t1]; ranges nest or are disjoint (checked)."""
    best: TimedRange | None = None
    i = bisect.bisect_right(starts, t0)
    for candidate in reversed(ranges[:i]):
        if candidate.start_ns <= t0 and t1 <= candidate.end_ns:
            if best is None or candidate.start_ns >= best.start_ns:
                best = candidate
        elif candidate.start_ns <= t0 <= candidate.end_ns < t1:
            raise AttributionError(f"a launch starts inside {candidate.name} but ends after it")
    return best.name if best else None


def nested_ownership(window: ProfiledWindow) -> ScopeOwnership:
    """Each device activity to the innermost named range holding its launch call."""
    by_thread: dict[int, list[TimedRange]] = defaultdict(list)
    for r in window.ranges:
        by_thread[r.thread].append(r)
    for items in by_thread.values():
        items.sort(key=lambda r: (r.start_ns, -r.end_ns))
        for i, outer in enumerate(items):
            for inner in items[i + 1 :]:
                if inner.start_ns >= outer.end_ns:
                    break
                if inner.end_ns > outer.end_ns:
                    raise AttributionError(
                        f"scopes {outer.name} and {inner.name} overlap without nesting"
                    )
    starts = {t: [r.start_ns for r in items] for t, items in by_thread.items()}
    launches: dict[int, list[Any]] = defaultdict(list)
    for call in dict.fromkeys(window.launches):
        launches[call.correlation].append(call)
    per_ns: dict[str, int] = defaultdict(int)
    per_names: dict[str, list[str]] = defaultdict(list)
    per_streams: dict[str, set[int]] = defaultdict(set)
    outside_ns = 0
    outside_names: list[str] = []
    total = 0
    for activity in dict.fromkeys(window.activities):
        total += activity.duration_ns
        owners = set()
        for call in launches.get(activity.correlation, ()):
            items = by_thread.get(call.thread, [])
            owners.add(_innermost(items, starts.get(call.thread, []), call.start_ns, call.end_ns))
        if len(owners) > 1:
            raise AttributionError(
                f"activity {activity.name} is claimed by launches in different scopes"
            )
        owner = owners.pop() if owners else None
        if owner is None:
            outside_ns += activity.duration_ns
            outside_names.append(activity.name)
        else:
            per_ns[owner] += activity.duration_ns
            per_names[owner].append(activity.name)
            per_streams[owner].add(activity.stream)
    if sum(per_ns.values()) + outside_ns != total:
        raise AttributionError("scope ownership does not conserve the traced activity total")
    return ScopeOwnership(
        dict(per_ns),
        dict(per_names),
        total,
        outside_ns,
        outside_names,
        {k: sorted(v) for k, v in per_streams.items()},
    )


def trace(fn: Callable[[Any], Any]) -> ProfiledWindow:
    """Run ``fn(capture)`` under one CUDA profiler session and return its window.

    ``fn`` receives the capture and marks nested scopes with ``capture.region(name)``.
    """
    import torch

    from acquisition.protocol.profiling import ProfilerCapture

    torch.cuda.synchronize()
    capture = ProfilerCapture("cuda", streams=True)
    with capture:
        fn(capture)
    return capture.window()


def launched_activity_names(fn: Callable[[], Any]) -> list[str]:
    """Names of the device activities that ``fn`` launches (CUDA), outside any timing."""

    def run(capture: Any) -> None:
        with capture.region("probe"):
            fn()

    ownership = nested_ownership(trace(run))
    return list(ownership.per_scope_names.get("probe", []))
