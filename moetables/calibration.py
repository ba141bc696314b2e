"""Calibrating a cluster description's alpha-beta link model from a measured NCCL sweep (R45).

A sweep (``scripts/h200x2_nccl_sweep.py run``) times each collective at message sizes from a few
KiB to hundreds of MiB per rank. This module turns that raw record into the parameters of the
cluster description's collectives::

    t_us = alpha_us + factor(op, n) * S_bytes / (bus_bandwidth_GBps * 1e3)

where ``S`` is the nccl-tests "size" of the operation (all_gather and reduce_scatter: the whole
gathered tensor over all ranks; all_reduce, broadcast, reduce: the buffer) and ``factor`` is
nccl-tests' bus-bandwidth factor. The fit is deliberately two-ended: the bandwidth comes from a
straight-line least-squares fit on the large messages (where alpha is negligible and the slope is
the link's bus bandwidth), alpha from the small messages with that slope held fixed (where the
transfer term is negligible and the latency dominates). A single least-squares fit over all sizes
would let the microsecond-scale latency be decided by the millisecond-scale points. What the
two-ended line misses in between (NCCL's protocol changes, LL -> LL128 -> Simple) is reported per
point, never hidden.

Pure numpy and pyyaml: the device-side timing lives in the script, not here.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml

OPS: tuple[str, ...] = ("all_gather", "reduce_scatter", "all_reduce", "broadcast", "reduce")
SWEEP_SCHEMA = "moe-nccl-sweep"


class CalibrationError(ValueError):
    """A sweep record or a fit request that cannot give a trustworthy link model."""


def bus_factor(op: str, ranks: int) -> float:
    """nccl-tests' bus-bandwidth factor of ``op`` over ``ranks`` ranks."""
    if ranks < 2:
        raise CalibrationError(f"a collective needs at least 2 ranks, got {ranks}")
    if op in ("all_gather", "reduce_scatter"):
        return (ranks - 1) / ranks
    if op == "all_reduce":
        return 2.0 * (ranks - 1) / ranks
    if op in ("broadcast", "reduce"):
        return 1.0
    raise CalibrationError(f"unknown collective {op!r}; expected one of {', '.join(OPS)}")


def nccl_size(op: str, ranks: int, bytes_per_rank: int) -> int:
    """The nccl-tests ``size`` S of ``op`` when each rank contributes or holds ``bytes_per_rank``.

    all_gather: each rank sends ``bytes_per_rank``, the gathered tensor is ``ranks`` times that;
    reduce_scatter: each rank keeps ``bytes_per_rank`` of a ``ranks`` times larger input; the
    others move one buffer of ``bytes_per_rank``.
    """
    bus_factor(op, ranks)  # validates op and ranks
    return bytes_per_rank * ranks if op in ("all_gather", "reduce_scatter") else bytes_per_rank


@dataclass(frozen=True)
class SweepPoint:
    """One (op, size) of a sweep: the per-iteration kernel times of every rank."""

    op: str
    ranks: int
    bytes_per_rank: int
    size_bytes: int
    rank_times_us: tuple[tuple[float, ...], ...]  # [rank][iteration]

    @property
    def iteration_times_us(self) -> tuple[float, ...]:
        """Per iteration, the shortest rank's kernel: the last rank to arrive waits for nobody.

        With no arrival skew all ranks read the same; any residual launch skew lengthens only the
        earlier ranks' kernels, so the minimum is the transfer itself.
        """
        return tuple(min(column) for column in zip(*self.rank_times_us, strict=True))

    @property
    def time_us(self) -> float:
        """Median over iterations of the last arriver's kernel time."""
        return float(statistics.median(self.iteration_times_us))

    @property
    def x_bytes(self) -> float:
        """factor(op, n) * S: the bytes the bus bandwidth must move."""
        return bus_factor(self.op, self.ranks) * self.size_bytes


@dataclass(frozen=True)
class Sweep:
    """A validated sweep record: the points plus what was measured where."""

    ranks: int
    points: tuple[SweepPoint, ...]
    meta: Mapping[str, Any] = field(default_factory=dict)

    def of(self, op: str) -> list[SweepPoint]:
        found = sorted((p for p in self.points if p.op == op), key=lambda p: p.bytes_per_rank)
        if not found:
            raise CalibrationError(f"the sweep has no {op!r} points")
        return found


def parse_sweep(document: Mapping[str, Any]) -> Sweep:
    """Validate a sweep document (as the script writes it) into a :class:`Sweep`."""
    if document.get("schema") != SWEEP_SCHEMA:
        raise CalibrationError(f"not a sweep record: schema is {document.get('schema')!r}, expected {SWEEP_SCHEMA!r}")
    ranks = document.get("ranks")
    if not isinstance(ranks, int) or ranks < 2:
        raise CalibrationError(f"sweep 'ranks' must be an integer >= 2, got {ranks!r}")
    points: list[SweepPoint] = []
    for i, rec in enumerate(document.get("points", [])):
        op = rec.get("op")
        per_rank = rec.get("bytes_per_rank")
        times = rec.get("rank_times_us")
        if op not in OPS:
            raise CalibrationError(f"point {i}: unknown op {op!r}")
        if not isinstance(per_rank, int) or per_rank <= 0:
            raise CalibrationError(f"point {i} ({op}): bytes_per_rank must be a positive integer, got {per_rank!r}")
        if not isinstance(times, list) or len(times) != ranks:
            raise CalibrationError(f"point {i} ({op}, {per_rank} B): rank_times_us needs one list per rank ({ranks})")
        lengths = {len(t) for t in times}
        if len(lengths) != 1 or 0 in lengths:
            raise CalibrationError(f"point {i} ({op}, {per_rank} B): every rank needs the same, non-zero iteration count")
        clean = tuple(tuple(float(v) for v in t) for t in times)
        if any(not np.isfinite(v) or v <= 0 for t in clean for v in t):
            raise CalibrationError(f"point {i} ({op}, {per_rank} B): kernel times must be finite and positive")
        size = rec.get("size_bytes", nccl_size(op, ranks, per_rank))
        if size != nccl_size(op, ranks, per_rank):
            raise CalibrationError(f"point {i} ({op}): size_bytes {size} disagrees with {per_rank} B per rank")
        points.append(SweepPoint(op, ranks, per_rank, int(size), clean))
    if not points:
        raise CalibrationError("the sweep has no points")
    return Sweep(ranks=ranks, points=tuple(points), meta=dict(document.get("meta", {})))


def load_sweep(path: str | Path) -> Sweep:
    with open(path, encoding="utf-8") as f:
        return parse_sweep(json.load(f))


@dataclass(frozen=True)
class CollectiveFit:
    """Alpha-beta parameters of one collective and how well they describe every measured size."""

    op: str
    ranks: int
    alpha_us: float
    bus_bandwidth_GBps: float  # noqa: N815 - the cluster file's own key
    large_bytes_per_rank: tuple[int, ...]
    small_bytes_per_rank: tuple[int, ...]
    residuals: tuple[tuple[int, float, float], ...]  # (bytes_per_rank, measured_us, model_us)

    def model_us(self, size_bytes: float) -> float:
        return self.alpha_us + bus_factor(self.op, self.ranks) * size_bytes / (self.bus_bandwidth_GBps * 1e3)

    @property
    def max_relative_error(self) -> float:
        return max(abs(m - t) / t for _, t, m in self.residuals)


def fit_collective(
    points: Sequence[SweepPoint],
    *,
    large_min_bytes_per_rank: int = 32 << 20,
    small_max_bytes_per_rank: int = 64 << 10,
) -> CollectiveFit:
    """Two-ended alpha-beta fit of one collective (see the module docstring)."""
    if not points:
        raise CalibrationError("no points to fit")
    op, ranks = points[0].op, points[0].ranks
    if any(p.op != op or p.ranks != ranks for p in points):
        raise CalibrationError("fit_collective takes the points of one op and one rank count")
    large = [p for p in points if p.bytes_per_rank >= large_min_bytes_per_rank]
    small = [p for p in points if p.bytes_per_rank <= small_max_bytes_per_rank]
    if len(large) < 2:
        raise CalibrationError(
            f"{op}: the bandwidth fit needs at least 2 sizes >= {large_min_bytes_per_rank} B per rank, got {len(large)}")
    if not small:
        raise CalibrationError(f"{op}: the latency fit needs a size <= {small_max_bytes_per_rank} B per rank")
    x = np.array([p.x_bytes for p in large])
    y = np.array([p.time_us for p in large])
    slope, _intercept = np.polyfit(x, y, 1)
    if not slope > 0:
        raise CalibrationError(f"{op}: the large messages give a non-positive slope ({slope}); the sweep is not usable")
    bus_gbps = 1.0 / (float(slope) * 1e3)
    # alpha: least squares of t - slope*x over the small sizes with the slope fixed = their mean.
    alpha = float(np.mean([p.time_us - slope * p.x_bytes for p in small]))
    if alpha < 0:
        raise CalibrationError(f"{op}: the small messages give a negative latency ({alpha:.3f} us)")
    fit = CollectiveFit(op, ranks, alpha, bus_gbps, tuple(p.bytes_per_rank for p in large),
                        tuple(p.bytes_per_rank for p in small), ())
    residuals = tuple((p.bytes_per_rank, p.time_us, fit.model_us(p.size_bytes)) for p in points)
    return CollectiveFit(op, ranks, alpha, bus_gbps, fit.large_bytes_per_rank, fit.small_bytes_per_rank, residuals)


def fit_sweep(sweep: Sweep, **kwargs: int) -> dict[str, CollectiveFit]:
    """Fit every op the sweep measured, in the cluster file's order."""
    return {op: fit_collective(sweep.of(op), **kwargs) for op in OPS if any(p.op == op for p in sweep.points)}


def cluster_document(
    *,
    name: str,
    description: str,
    provenance: Mapping[str, str],
    link: str,
    fits: Mapping[str, CollectiveFit],
    ranks: Sequence[int],
) -> dict[str, Any]:
    """The cluster description (schema ``moe-cluster`` version 1) of one link class and one group."""
    missing = [op for op in OPS if op not in fits]
    if missing:
        raise CalibrationError(f"the cluster description needs all five collectives; missing {', '.join(missing)}")
    for key in ("hardware", "software", "command", "measured_at"):
        if not provenance.get(key):
            raise CalibrationError(f"provenance needs {key!r}")
    collectives = {op: {"alpha_us": round(fits[op].alpha_us, 3),
                        "bus_bandwidth_GBps": round(fits[op].bus_bandwidth_GBps, 2)} for op in OPS}
    return {
        "schema": "moe-cluster",
        "version": 1,
        "name": name,
        "description": description,
        "provenance": dict(provenance),
        "link_classes": {link: {"collectives": collectives}},
        "groups": [{"link": link, "ranks": [int(r) for r in ranks]}],
    }


def dump_cluster(document: Mapping[str, Any]) -> str:
    """YAML text of a cluster description, keys in the documented order, flow style for leaves."""

    class _Dumper(yaml.SafeDumper):
        pass

    def _leaf(dumper: yaml.SafeDumper, data: dict[str, Any]) -> yaml.Node:
        # Flow style for the leaves the format shows inline: a collective's two numbers, a group.
        flow = set(data) <= {"alpha_us", "bus_bandwidth_GBps"} or "ranks" in data
        return dumper.represent_mapping("tag:yaml.org,2002:map", data.items(), flow_style=flow)

    _Dumper.add_representer(dict, _leaf)
    return yaml.dump(dict(document), Dumper=_Dumper, sort_keys=False, width=100, allow_unicode=True)
