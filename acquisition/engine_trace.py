"""The MoE block's CUDA activity inside a running engine, read from a PyTorch Chrome trace.

Used by the two-GPU validation of the layer estimate (``scripts/h200x2_estimate_validation.py``,
issue 11 part 5): forward hooks on the MoE block open and close a ``record_function`` range
(``<prefix>#<index>``) in the engine's worker, and the router's capture hook counts the step's
top-k ids inside a nested range of its own (``<exclude>#<index>``). Here, on a trace exported
by ``torch.profiler``, a device activity (kernel, memcpy, memset) belongs to block ``index`` when
the CUDA runtime or driver call that launched it (same ``args.correlation``) lies inside that
block's range on the same process and thread, and not inside an excluded range. Per block:
compute is the sum of the non-NCCL activities' durations (no launch gaps, no CPU time), and the
NCCL kernels are listed on their own in launch order, since their duration holds the wait for the
last rank to arrive as well as the transfer.

No torch: the trace is plain JSON, so this is tested on CPU.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

DEVICE_CATEGORIES = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})
LAUNCH_CATEGORIES = frozenset({"cuda_runtime", "cuda_driver"})
RANGE_CATEGORIES = frozenset({"user_annotation", "cpu_op", "python_function"})


class EngineTraceError(ValueError):
    """A trace that cannot be attributed without guessing."""


@dataclass(frozen=True)
class Activity:
    name: str
    category: str
    start_us: float
    duration_us: float
    correlation: int

    @property
    def nccl(self) -> bool:
        return self.category == "kernel" and self.name.lower().startswith("nccl")


@dataclass(frozen=True)
class Block:
    """One MoE block forward: its range and the activities it launched."""

    index: int
    pid: Any
    tid: Any
    start_us: float
    end_us: float
    activities: tuple[Activity, ...]  # in launch order
    excluded: int  # activities launched inside an excluded (observation) range

    @property
    def compute_us(self) -> float:
        return sum(a.duration_us for a in self.activities if not a.nccl)

    @property
    def nccl(self) -> tuple[Activity, ...]:
        return tuple(a for a in self.activities if a.nccl)

    def to_json(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "compute_us": round(self.compute_us, 3),
            "nccl_us": [round(a.duration_us, 3) for a in self.nccl],
            "nccl_names": [a.name[:80] for a in self.nccl],
            "excluded_activities": self.excluded,
            "activities": [
                [a.name[:80], a.category, round(a.start_us, 3), round(a.duration_us, 3)]
                for a in self.activities
            ],
        }


def _index(name: str, prefix: str) -> int | None:
    if not name.startswith(prefix + "#"):
        return None
    tail = name[len(prefix) + 1 :]
    return int(tail) if tail.isdigit() else None


def attribute_blocks(
    events: Iterable[Mapping[str, Any]], *, prefix: str, exclude_prefix: str | None = None
) -> list[Block]:
    """Blocks of the trace (``traceEvents``), in index order. See the module docstring.

    Failures rather than guesses: two ranges of one index, a device activity whose launch is in
    two blocks, an activity with no launch call found while its correlation is claimed by a block.
    """
    ranges: dict[int, tuple[Any, Any, float, float]] = {}
    excluded: list[tuple[Any, Any, float, float]] = []
    launches: dict[int, list[tuple[Any, Any, float]]] = {}
    device: list[Activity] = []
    for ev in events:
        if ev.get("ph") != "X":
            continue
        cat = ev.get("cat", "")
        name = str(ev.get("name", ""))
        ts, dur = float(ev.get("ts", 0.0)), float(ev.get("dur", 0.0))
        if cat in RANGE_CATEGORIES:
            k = _index(name, prefix)
            if k is not None:
                if k in ranges:
                    raise EngineTraceError(f"two ranges named {name!r}")
                ranges[k] = (ev.get("pid"), ev.get("tid"), ts, ts + dur)
            elif exclude_prefix is not None and _index(name, exclude_prefix) is not None:
                excluded.append((ev.get("pid"), ev.get("tid"), ts, ts + dur))
        elif cat in LAUNCH_CATEGORIES:
            corr = (ev.get("args") or {}).get("correlation")
            if corr is not None:
                launches.setdefault(int(corr), []).append((ev.get("pid"), ev.get("tid"), ts))
        elif cat in DEVICE_CATEGORIES:
            corr = (ev.get("args") or {}).get("correlation")
            if corr is None:
                raise EngineTraceError(f"device activity {name!r} at {ts} has no correlation id")
            device.append(Activity(name, cat, ts, dur, int(corr)))

    order = sorted(ranges.items(), key=lambda kv: kv[1][2])
    starts = [r[2] for _, r in order]
    for (_, a), (_, b) in itertools.pairwise(order):
        if b[2] < a[3] and (a[0], a[1]) == (b[0], b[1]):
            raise EngineTraceError("MoE block ranges overlap on one thread")

    def inside(pid: Any, tid: Any, ts: float, box: tuple[Any, Any, float, float]) -> bool:
        return (pid, tid) == (box[0], box[1]) and box[2] <= ts <= box[3]

    owned: dict[int, list[tuple[float, Activity]]] = {k: [] for k in ranges}
    dropped: dict[int, int] = dict.fromkeys(ranges, 0)
    for act in device:
        hosts = launches.get(act.correlation, [])
        owners: set[int] = set()
        launch: tuple[Any, Any, float] | None = None
        for pid, tid, ts in hosts:
            i = bisect.bisect_right(starts, ts) - 1
            if i >= 0 and inside(pid, tid, ts, order[i][1]):
                owners.add(order[i][0])
                launch = (pid, tid, ts)
        if len(owners) > 1:
            raise EngineTraceError(
                f"{act.name!r} (correlation {act.correlation}) is claimed by blocks {sorted(owners)}"
            )
        if not owners:
            continue
        k = owners.pop()
        assert launch is not None
        if any(inside(launch[0], launch[1], launch[2], box) for box in excluded):
            dropped[k] += 1
            continue
        owned[k].append((launch[2], act))
    return [
        Block(
            k,
            r[0],
            r[1],
            r[2],
            r[3],
            tuple(a for _, a in sorted(owned[k], key=lambda x: (x[0], x[1].start_us))),
            dropped[k],
        )
        for k, r in sorted(ranges.items())
    ]


def last_arriver_transfer_us(per_rank_nccl_us: Sequence[Sequence[float]]) -> list[float]:
    """Per collective kernel of one block (paired by launch order across ranks): the shortest rank's
    duration. The last rank to arrive waits for nobody, so its kernel is the transfer itself.
    """
    counts = {len(r) for r in per_rank_nccl_us}
    if len(counts) != 1:
        raise EngineTraceError(
            f"ranks launched different numbers of NCCL kernels in one block: {sorted(counts)}"
        )
    return [min(col) for col in zip(*per_rank_nccl_us, strict=True)]
