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
would let the microsecond-scale latency be decided by the millisecond-scale points.

The straight line misses the middle sizes: on two H200s it is 20-50 % fast between 256 KiB and
16 MiB per rank, where NCCL changes protocol and channel count (the MoE block's hidden states
live exactly there). So the fit also gives each op a bandwidth-by-size table (cluster format
version 2): at every measured size from the first whose bandwidth term is at least
``table_min_share`` of its time (below that, t - alpha is latency noise), the effective bus
bandwidth ``factor x S / (t - alpha)``. The model reads it linearly in log2(S) between sizes and
at the nearest size outside them (``moetables.comm.LinkParameters``), so it reproduces every
tabled median; how well it predicts a size it has not seen is the leave-one-out error
(``CollectiveFit.loo_residuals``), reported with the line's residuals, never hidden.

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
        raise CalibrationError(
            f"not a sweep record: schema is {document.get('schema')!r}, expected {SWEEP_SCHEMA!r}"
        )
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
            raise CalibrationError(
                f"point {i} ({op}): bytes_per_rank must be a positive integer, got {per_rank!r}"
            )
        if not isinstance(times, list) or len(times) != ranks:
            raise CalibrationError(
                f"point {i} ({op}, {per_rank} B): rank_times_us needs one list per rank ({ranks})"
            )
        lengths = {len(t) for t in times}
        if len(lengths) != 1 or 0 in lengths:
            raise CalibrationError(
                f"point {i} ({op}, {per_rank} B): every rank needs the same, non-zero iteration count"
            )
        clean = tuple(tuple(float(v) for v in t) for t in times)
        if any(not np.isfinite(v) or v <= 0 for t in clean for v in t):
            raise CalibrationError(
                f"point {i} ({op}, {per_rank} B): kernel times must be finite and positive"
            )
        size = rec.get("size_bytes", nccl_size(op, ranks, per_rank))
        if size != nccl_size(op, ranks, per_rank):
            raise CalibrationError(
                f"point {i} ({op}): size_bytes {size} disagrees with {per_rank} B per rank"
            )
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
    residuals: tuple[tuple[int, float, float], ...]  # (bytes_per_rank, measured_us, line_us)
    # (S bytes, effective bus GB/s) per tabled size; () when the table is not fitted.
    bandwidth_by_size: tuple[tuple[int, float], ...] = ()
    # (bytes_per_rank, measured_us, model_us with that size left out of the table)
    loo_residuals: tuple[tuple[int, float, float], ...] = ()

    def line_us(self, size_bytes: float) -> float:
        """The straight line: alpha + factor x S / the large-size bandwidth."""
        return self.alpha_us + bus_factor(self.op, self.ranks) * size_bytes / (
            self.bus_bandwidth_GBps * 1e3
        )

    def model_us(self, size_bytes: float) -> float:
        """The shipped model: the line's alpha, the bandwidth from the table (if any)."""
        return _table_time(
            self.alpha_us,
            bus_factor(self.op, self.ranks),
            self.bus_bandwidth_GBps,
            self.bandwidth_by_size,
            size_bytes,
        )

    @property
    def max_relative_error(self) -> float:
        return max(abs(m - t) / t for _, t, m in self.residuals)


def _table_time(
    alpha: float, factor: float, bus_gbps: float, table: Sequence[tuple[int, float]], size: float
) -> float:
    """The cluster model's time (moetables.comm.LinkParameters, kept equal by a test)."""
    if not table:
        return alpha + factor * size / (bus_gbps * 1e3)
    sizes = np.log2([float(s) for s, _ in table])
    bw = float(np.interp(np.log2(max(size, 1.0)), sizes, [b for _, b in table]))
    return alpha + factor * size / (bw * 1e3)


def fit_collective(
    points: Sequence[SweepPoint],
    *,
    large_min_bytes_per_rank: int = 32 << 20,
    small_max_bytes_per_rank: int = 64 << 10,
    table_min_share: float | None = 0.2,
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
            f"{op}: the bandwidth fit needs at least 2 sizes >= {large_min_bytes_per_rank} B per rank, got {len(large)}"
        )
    if not small:
        raise CalibrationError(
            f"{op}: the latency fit needs a size <= {small_max_bytes_per_rank} B per rank"
        )
    x = np.array([p.x_bytes for p in large])
    y = np.array([p.time_us for p in large])
    slope, _intercept = np.polyfit(x, y, 1)
    if not slope > 0:
        raise CalibrationError(
            f"{op}: the large messages give a non-positive slope ({slope}); the sweep is not usable"
        )
    bus_gbps = 1.0 / (float(slope) * 1e3)
    # alpha: least squares of t - slope*x over the small sizes with the slope fixed = their mean.
    alpha = float(np.mean([p.time_us - slope * p.x_bytes for p in small]))
    if alpha < 0:
        raise CalibrationError(f"{op}: the small messages give a negative latency ({alpha:.3f} us)")
    fit = CollectiveFit(
        op,
        ranks,
        alpha,
        bus_gbps,
        tuple(p.bytes_per_rank for p in large),
        tuple(p.bytes_per_rank for p in small),
        (),
    )
    residuals = tuple((p.bytes_per_rank, p.time_us, fit.line_us(p.size_bytes)) for p in points)
    table: tuple[tuple[int, float], ...] = ()
    loo: tuple[tuple[int, float, float], ...] = ()
    if table_min_share is not None:
        if not 0 < table_min_share < 1:
            raise CalibrationError(f"table_min_share must be in (0, 1), got {table_min_share}")
        factor = bus_factor(op, ranks)
        first = next(
            (i for i, p in enumerate(points) if p.time_us - alpha >= table_min_share * p.time_us),
            None,
        )
        tabled = list(points[first:]) if first is not None else []
        if len(tabled) < 2:
            raise CalibrationError(
                f"{op}: fewer than 2 sizes whose bandwidth term is >= {table_min_share:.0%} of the time; "
                "no bandwidth table can be fitted"
            )
        if any(p.time_us <= alpha for p in tabled):
            raise CalibrationError(
                f"{op}: a tabled size is not slower than the latency; the sweep is not usable"
            )
        table = tuple(
            (p.size_bytes, factor * p.size_bytes / ((p.time_us - alpha) * 1e3)) for p in tabled
        )
        loo = tuple(
            (
                p.bytes_per_rank,
                p.time_us,
                _table_time(alpha, factor, bus_gbps, table[:i] + table[i + 1 :], p.size_bytes),
            )
            for i, p in enumerate(tabled)
        )
    return CollectiveFit(
        op,
        ranks,
        alpha,
        bus_gbps,
        fit.large_bytes_per_rank,
        fit.small_bytes_per_rank,
        residuals,
        table,
        loo,
    )


def fit_sweep(sweep: Sweep, **kwargs: Any) -> dict[str, CollectiveFit]:
    """Fit every op the sweep measured, in the cluster file's order."""
    return {
        op: fit_collective(sweep.of(op), **kwargs)
        for op in OPS
        if any(p.op == op for p in sweep.points)
    }


@dataclass(frozen=True)
class GroupedLaunch:
    """One measured NCCL kernel that ran several operations of one op launched as a group."""

    op: str
    ranks: int
    sizes_bytes: tuple[int, ...]  # nccl-tests S of each operation in the group
    measured_us: float  # the last-arriving rank's kernel

    def model_us(self, fit: CollectiveFit) -> float:
        """One latency and every operation's bandwidth term, no per-operation cost."""
        return fit.alpha_us + sum(fit.model_us(s) - fit.alpha_us for s in self.sizes_bytes)


def fit_group_op_us(fits: Mapping[str, CollectiveFit], launches: Sequence[GroupedLaunch]) -> float:
    """The cost of each operation beyond the first in one grouped NCCL launch.

    The sweep times one operation per kernel; vLLM groups several (its dispatch of hidden states,
    top-k weights and ids is one kernel of three all-gathers; an unequal-count gather one of a
    broadcast per root). A grouped kernel measured on the engine minus the sweep's model of its
    operations (one latency, each operation's bytes) is what grouping adds; the median over the
    launches, per operation beyond the first, is ``group_op_us`` (never below zero).
    """
    if len(launches) < 3:
        raise CalibrationError(
            f"the per-operation cost needs at least 3 grouped launches, got {len(launches)}"
        )
    excess = []
    for launch in launches:
        if len(launch.sizes_bytes) < 2:
            raise CalibrationError(
                f"a grouped launch needs at least 2 operations, got {launch.sizes_bytes}"
            )
        fit = fits.get(launch.op)
        if fit is None or fit.ranks != launch.ranks:
            raise CalibrationError(
                f"no {launch.op} fit over {launch.ranks} ranks for a grouped launch"
            )
        excess.append((launch.measured_us - launch.model_us(fit)) / (len(launch.sizes_bytes) - 1))
    return max(0.0, float(statistics.median(excess)))


def cluster_document(
    *,
    name: str,
    description: str,
    provenance: Mapping[str, str],
    link: str,
    fits: Mapping[str, CollectiveFit],
    ranks: Sequence[int],
    group_op_us: float | None = None,
) -> dict[str, Any]:
    """The cluster description (schema ``moe-cluster``) of one link class and one group: version 2
    when some op carries a bandwidth-by-size table, else version 1."""
    missing = [op for op in OPS if op not in fits]
    if missing:
        raise CalibrationError(
            f"the cluster description needs all five collectives; missing {', '.join(missing)}"
        )
    for key in ("hardware", "software", "command", "measured_at"):
        if not provenance.get(key):
            raise CalibrationError(f"provenance needs {key!r}")
    collectives: dict[str, dict[str, Any]] = {}
    for op in OPS:
        entry: dict[str, Any] = {
            "alpha_us": round(fits[op].alpha_us, 3),
            "bus_bandwidth_GBps": round(fits[op].bus_bandwidth_GBps, 2),
        }
        if fits[op].bandwidth_by_size:
            entry["bandwidth_by_size"] = [
                [int(size), round(bw, 2)] for size, bw in fits[op].bandwidth_by_size
            ]
        collectives[op] = entry
    return {
        "schema": "moe-cluster",
        "version": 2
        if group_op_us is not None or any(f.bandwidth_by_size for f in fits.values())
        else 1,
        "name": name,
        "description": description,
        "provenance": dict(provenance),
        "link_classes": {
            link: {
                "collectives": collectives,
                **({"group_op_us": round(group_op_us, 3)} if group_op_us is not None else {}),
            }
        },
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

    def _pair(dumper: yaml.SafeDumper, data: list[Any]) -> yaml.Node:
        # A table's [size, GBps] point inline, the table itself one point per line.
        flow = len(data) == 2 and all(isinstance(v, (int, float)) for v in data)
        return dumper.represent_sequence("tag:yaml.org,2002:seq", data, flow_style=flow)

    _Dumper.add_representer(dict, _leaf)
    _Dumper.add_representer(list, _pair)
    return yaml.dump(dict(document), Dumper=_Dumper, sort_keys=False, width=100, allow_unicode=True)
