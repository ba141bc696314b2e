"""The block trace of one MoE layer (R44) and the link model that times its collectives (R45).

A trace is the dependency-ordered list of what every EP rank runs: measured components
(compute, looked up in the bundle) and logical collectives (bytes from the contract's recorded
dtypes and widths, timed by a cluster description, never by the bundle). Per deployment kind:

- ``dp_ep_modular`` (DP > 1): gate_routing on local rows; AllGather of hidden states, top-k
  weights and top-k ids; experts on the gathered rows; ReduceScatter back to local rows;
  finalize_copy; with TP > 1 the wrapper's AllGather (sequence parallel) or AllReduce;
  with FP8 activations, dispatch_quant (local rows) before the AllGather, which then moves FP8
  rows and their float32 group scales;
- ``dp1_modular`` (DP = 1): gate_routing, experts, and an AllReduce over TP only when TP > 1;
- ``live_tp1`` (TP1/DP1/EP1 live path): gate_routing, experts, wrapper; no collectives. The
  order is a serial representation of measured durations, not a claim about concurrency.

Which kernels a logical collective becomes follows vLLM 0.26.0's ``all_gatherv`` and
``reduce_scatterv`` (measured on two H200s): equal per-rank counts run one ncclAllGather or
ncclReduceScatter; unequal counts run a group of ncclBroadcast (one per root) or ncclReduce
(one per root) calls.

Transfers follow what vLLM 0.26.0 launches, measured on two H200s: the three dispatched
tensors are one NCCL group (one kernel), and so is every unequal-count gather or scatter (one
operation per root). Collectives sharing a ``launch`` are charged once: one latency, a cluster's
``group_op_us`` per further operation, and every operation's bytes at the bandwidth of its size
(``launch_transfer_us``); the roots of an unequal-count collective are charged one after the
other, as the engine's kernels show (docs/cluster-format.md).

Timing: a collective starts when its last participant arrives. Each rank's time therefore
splits into compute (its components), wait (arrived early, waiting for the last rank) and
transfer (the collective itself, the same for all participants): the worst-rank envelope of
R45. Without a cluster, transfers are unknown: they are reported as ``None`` with their bytes,
and waits (which depend only on compute skew, since every participant of one collective would
see the same transfer time) are still given.
"""

from __future__ import annotations

import copy
import datetime
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import numpy.typing as npt
import yaml

from moetables.bundle.model import EXPERTS, TableEntry
from moetables.errors import QueryError

# The local quantization of a modular DP+EP rank with FP8 activations.
DISPATCH_QUANT = "dispatch_quant"

__all__ = [
    "COLLECTIVE_OPS",
    "Cluster",
    "ClusterError",
    "CollectiveStep",
    "ComputeStep",
    "LinkClass",
    "LinkParameters",
    "TensorWidths",
    "Trace",
    "build_trace",
    "deployment_kind",
    "dtype_bytes",
    "launch_runs",
    "launch_transfer_us",
    "load_cluster",
    "parse_cluster",
    "tensor_widths",
]

COLLECTIVE_OPS = ("all_gather", "reduce_scatter", "all_reduce", "broadcast", "reduce")
# Version 2 adds the optional per-op ``bandwidth_by_size`` and per-class ``group_op_us``;
# version 1 files load unchanged.
VERSIONS = (1, 2)


# NCCL's bus-bandwidth factors (nccl-tests PERFORMANCE.md): busBw = algBw * factor.
def _bus_factor(op: str, n: int) -> float:
    if op in ("all_gather", "reduce_scatter"):
        return (n - 1) / n
    if op == "all_reduce":
        return 2 * (n - 1) / n
    return 1.0  # broadcast, reduce


Kind = Literal["dp_ep_modular", "dp1_modular", "live_tp1"]
FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

_DTYPE_BYTES = {
    "bfloat16": 2,
    "float16": 2,
    "half": 2,
    "float32": 4,
    "float": 4,
    "float64": 8,
    "int8": 1,
    "uint8": 1,
    "int16": 2,
    "int32": 4,
    "int64": 8,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
    "float8_e4m3fnuz": 1,
    "float8_e5m2fnuz": 1,
}


def dtype_bytes(name: str, *, what: str) -> int:
    """Bytes per element of a recorded dtype name (``bfloat16`` or ``torch.bfloat16``)."""
    key = name.removeprefix("torch.") if isinstance(name, str) else None
    if key not in _DTYPE_BYTES:
        raise QueryError(f"the contract records {what} as {name!r}, a dtype of unknown width")
    return _DTYPE_BYTES[key]


# ---------------------------------------------------------------------------- cluster file


class ClusterError(ValueError):
    """A malformed cluster description; ``where`` names the file and field at fault."""

    def __init__(self, where: str, message: str) -> None:
        super().__init__(f"{where}: {message}")
        self.where = where
        self.message = message


@dataclass(frozen=True, slots=True)
class LinkParameters:
    """Alpha-beta of one collective on one link class, with an optional bandwidth-by-size table.

    ``bandwidth_by_size`` (cluster format version 2) holds (S bytes, bus GB/s) points, S
    increasing: NCCL changes protocol and channel count with the message size, and one straight
    line misses the middle sizes by 20-50 % on two H200s (docs/benchmarks.md). Between points
    the bandwidth is linear in log2(S); outside them it is the nearest point's. Without a table
    it is ``bus_bandwidth_GBps`` at every size.
    """

    alpha_us: float
    bus_bandwidth_GBps: float  # noqa: N815 (the file's field name)
    bandwidth_by_size: tuple[tuple[float, float], ...] = ()

    def bandwidth_GBps(self, size_bytes: npt.ArrayLike) -> FloatArray:  # noqa: N802 (unit)
        """The bus bandwidth at nccl-tests size ``size_bytes``."""
        s = np.asarray(size_bytes, dtype=np.float64)
        if not self.bandwidth_by_size:
            return np.full(s.shape, self.bus_bandwidth_GBps)
        table = np.asarray(self.bandwidth_by_size, dtype=np.float64)
        out: FloatArray = np.interp(np.log2(np.maximum(s, 1.0)), np.log2(table[:, 0]), table[:, 1])
        return out

    def bytes_us(self, link_bytes: npt.ArrayLike, size_bytes: npt.ArrayLike) -> FloatArray:
        """The bandwidth term: ``link_bytes`` (factor x S, or the busiest link's bytes) at the
        bus bandwidth of an operation of nccl-tests size ``size_bytes``."""
        out: FloatArray = np.asarray(link_bytes, dtype=np.float64) / (
            self.bandwidth_GBps(size_bytes) * 1e3
        )
        return out

    def time_us(self, op: str, ranks: int, size_bytes: npt.ArrayLike) -> Any:
        """t = alpha + factor(op, n) * S / bandwidth(S), S as nccl-tests counts it."""
        s = np.asarray(size_bytes, dtype=np.float64)
        return self.alpha_us + self.bytes_us(_bus_factor(op, ranks) * s, s)


@dataclass(frozen=True, slots=True)
class LinkClass:
    name: str
    collectives: Mapping[str, LinkParameters]
    # Each NCCL operation beyond the first in one grouped launch (one kernel) adds this much
    # (format version 2; 0 in version 1 files). See ``launch_transfer_us``.
    group_op_us: float = 0.0


@dataclass(frozen=True, slots=True)
class LinkGroup:
    link: str
    ranks: frozenset[int]


@dataclass(frozen=True)
class Cluster:
    """A validated cluster description (``schema: moe-cluster``, version 1 or 2)."""

    name: str
    description: str
    provenance: Mapping[str, str]
    link_classes: Mapping[str, LinkClass]
    groups: tuple[LinkGroup, ...]
    source: str = "<memory>"
    # The description as read (a plain mapping), so that it can be sent elsewhere inline:
    # RemoteTables hands a loaded cluster to the registry's estimate this way.
    raw: Mapping[str, Any] | None = field(default=None, compare=False, repr=False)
    # Link classes per participant tuple, found once (the groups never change).
    _memo: dict[tuple[int, ...], list[LinkClass]] = field(
        default_factory=dict, compare=False, repr=False
    )

    def ranks(self) -> frozenset[int]:
        return frozenset().union(*(g.ranks for g in self.groups))

    def classes_for(self, participants: Sequence[int]) -> list[LinkClass]:
        """The link classes a collective over ``participants`` is timed by.

        The smallest group holding every participant decides (its link is the tightest one
        they share). A collective no single group holds spans several groups: it is given
        every class of the groups it touches, and the slowest of them times it.
        """
        key = tuple(participants)
        found = self._memo.get(key)
        if found is not None:
            return found
        found = self._memo[key] = self._classes_for(key)
        return found

    def _classes_for(self, participants: tuple[int, ...]) -> list[LinkClass]:
        members = set(participants)
        missing = sorted(members - self.ranks())
        if missing:
            raise QueryError(
                f"cluster {self.name!r} ({self.source}) puts rank {missing[0]} in no group; "
                f"it describes ranks {sorted(self.ranks())}"
            )
        holding = [g for g in self.groups if members <= g.ranks]
        if holding:
            smallest = min(len(g.ranks) for g in holding)
            chosen = [g for g in holding if len(g.ranks) == smallest]
        else:
            chosen = [g for g in self.groups if members & g.ranks]
        return [self.link_classes[g.link] for g in chosen]

    def time_us(self, op: str, participants: Sequence[int], size_bytes: npt.ArrayLike) -> Any:
        """Modelled time of one collective; the slowest candidate link class wins."""
        times = [
            c.collectives[op].time_us(op, len(participants), size_bytes)
            for c in self.classes_for(participants)
        ]
        return np.maximum.reduce(times) if len(times) > 1 else times[0]


def _number(raw: Any, where: str, *, positive: bool) -> float:
    if isinstance(raw, bool) or not isinstance(raw, (int, float)) or not math.isfinite(raw):
        raise ClusterError(where, f"must be a finite number, got {raw!r}")
    if positive and raw <= 0:
        raise ClusterError(where, f"must be positive, got {raw!r}")
    if not positive and raw < 0:
        raise ClusterError(where, f"must not be negative, got {raw!r}")
    return float(raw)


def _exact_keys(raw: Any, where: str, required: set[str], optional: set[str] = frozenset()) -> None:  # type: ignore[assignment]
    if not isinstance(raw, dict):
        raise ClusterError(where, f"must be a mapping, got {type(raw).__name__}")
    missing = required - raw.keys()
    extra = raw.keys() - required - optional
    if missing:
        raise ClusterError(where, f"missing {sorted(missing)}")
    if extra:
        raise ClusterError(where, f"unknown field(s) {sorted(map(str, extra))}")


def _bandwidth_table(raw: Any, where: str) -> tuple[tuple[float, float], ...]:
    """[[S bytes, bus GB/s], ...]: two or more points, sizes strictly increasing."""
    if not isinstance(raw, list) or len(raw) < 2:
        raise ClusterError(where, "must be a list of at least two [size_bytes, GBps] points")
    points = []
    for i, point in enumerate(raw):
        if not isinstance(point, list) or len(point) != 2:
            raise ClusterError(f"{where}[{i}]", f"must be [size_bytes, GBps], got {point!r}")
        points.append(
            (
                _number(point[0], f"{where}[{i}] size", positive=True),
                _number(point[1], f"{where}[{i}] GBps", positive=True),
            )
        )
    for i in range(1, len(points)):
        if points[i][0] <= points[i - 1][0]:
            raise ClusterError(f"{where}[{i}]", "sizes must increase strictly")
    return tuple(points)


def parse_cluster(raw: Any, *, source: str = "<memory>") -> Cluster:
    """Validate a loaded cluster description; every problem names its field."""
    _exact_keys(
        raw,
        source,
        {"schema", "version", "name", "provenance", "link_classes", "groups"},
        {"description"},
    )
    if raw["schema"] != "moe-cluster":
        raise ClusterError(f"{source}: schema", f"must be 'moe-cluster', got {raw['schema']!r}")
    version = raw["version"]
    if version not in VERSIONS or isinstance(version, bool):
        raise ClusterError(
            f"{source}: version", f"only versions {list(VERSIONS)} are known, got {version!r}"
        )
    name = raw["name"]
    if not isinstance(name, str) or not name.strip():
        raise ClusterError(f"{source}: name", "must be a non-empty string")
    description = raw.get("description", "")
    if not isinstance(description, str):
        raise ClusterError(f"{source}: description", "must be a string")
    provenance = raw["provenance"]
    _exact_keys(
        provenance, f"{source}: provenance", {"hardware", "software", "command", "measured_at"}
    )
    for key in ("hardware", "software", "command"):
        if not isinstance(provenance[key], str) or not provenance[key].strip():
            raise ClusterError(f"{source}: provenance.{key}", "must be a non-empty string")
    measured = provenance["measured_at"]
    if isinstance(measured, datetime.date):  # YAML reads an unquoted date as a date
        measured = measured.isoformat()
    try:
        datetime.date.fromisoformat(str(measured))
        if len(str(measured)) != 10:
            raise ValueError
    except ValueError:
        raise ClusterError(
            f"{source}: provenance.measured_at", f"must be a date YYYY-MM-DD, got {measured!r}"
        ) from None
    classes_raw = raw["link_classes"]
    if not isinstance(classes_raw, dict) or not classes_raw:
        raise ClusterError(f"{source}: link_classes", "must be a non-empty mapping")
    classes: dict[str, LinkClass] = {}
    for cname, body in classes_raw.items():
        where = f"{source}: link_classes.{cname}"
        if not isinstance(cname, str):
            raise ClusterError(where, "a link class name must be a string")
        _exact_keys(body, where, {"collectives"}, {"group_op_us"})
        group_op = 0.0
        if "group_op_us" in body:
            if version < 2:
                raise ClusterError(f"{where}.group_op_us", "needs version 2 (version 1 has none)")
            group_op = _number(body["group_op_us"], f"{where}.group_op_us", positive=False)
        colls = body["collectives"]
        _exact_keys(colls, f"{where}.collectives", set(COLLECTIVE_OPS))
        params = {}
        for op in COLLECTIVE_OPS:
            at = f"{where}.collectives.{op}"
            _exact_keys(colls[op], at, {"alpha_us", "bus_bandwidth_GBps"}, {"bandwidth_by_size"})
            table: tuple[tuple[float, float], ...] = ()
            if "bandwidth_by_size" in colls[op]:
                if version < 2:
                    raise ClusterError(
                        f"{at}.bandwidth_by_size", "needs version 2 (version 1 has none)"
                    )
                table = _bandwidth_table(colls[op]["bandwidth_by_size"], f"{at}.bandwidth_by_size")
            params[op] = LinkParameters(
                alpha_us=_number(colls[op]["alpha_us"], f"{at}.alpha_us", positive=False),
                bus_bandwidth_GBps=_number(
                    colls[op]["bus_bandwidth_GBps"], f"{at}.bus_bandwidth_GBps", positive=True
                ),
                bandwidth_by_size=table,
            )
        classes[cname] = LinkClass(cname, params, group_op)
    groups_raw = raw["groups"]
    if not isinstance(groups_raw, list) or not groups_raw:
        raise ClusterError(f"{source}: groups", "must be a non-empty list")
    groups = []
    for i, g in enumerate(groups_raw):
        where = f"{source}: groups[{i}]"
        _exact_keys(g, where, {"link", "ranks"})
        if g["link"] not in classes:
            raise ClusterError(
                f"{where}.link", f"unknown link class {g['link']!r}; known are {sorted(classes)}"
            )
        ranks = g["ranks"]
        if (
            not isinstance(ranks, list)
            or not ranks
            or any(isinstance(r, bool) or not isinstance(r, int) or r < 0 for r in ranks)
        ):
            raise ClusterError(
                f"{where}.ranks", f"must be a non-empty list of ranks, got {ranks!r}"
            )
        if len(set(ranks)) != len(ranks):
            raise ClusterError(f"{where}.ranks", f"lists a rank twice: {ranks!r}")
        groups.append(LinkGroup(g["link"], frozenset(ranks)))
    return Cluster(
        name=name,
        description=description,
        provenance={k: str(v) for k, v in provenance.items()} | {"measured_at": str(measured)},
        link_classes=classes,
        groups=tuple(groups),
        source=source,
        raw=copy.deepcopy(raw),  # the caller's mapping may change later; this may not
    )


def load_cluster(path: str | Path) -> Cluster:
    """Read and validate a cluster description file."""
    p = Path(path)
    try:
        text = p.read_text("utf-8")
    except OSError as exc:
        raise ClusterError(str(p), f"cannot read: {exc.strerror or exc}") from None
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ClusterError(str(p), f"not YAML: {exc}") from None
    return parse_cluster(raw, source=str(p))


# ------------------------------------------------------------------------------- the trace


@dataclass(frozen=True, slots=True)
class TensorWidths:
    """Bytes per row of the tensors the collectives move, from the contract."""

    hidden_states: int
    topk_weights: int
    topk_ids: int
    source: str
    # FP8 activations (modular DP+EP with ``dispatch_quant``): the all-gather carries the
    # quantized rows and their per-group scales instead of the hidden states; the combine
    # (reduce-scatter) still moves ``hidden_states``-wide rows.
    dispatched_hidden_states: int | None = None
    dispatched_scales: int = 0


def _find(contract: Mapping[str, Any], *paths: str) -> Any:
    for path in paths:
        node: Any = contract
        for part in path.split("."):
            node = node.get(part) if isinstance(node, Mapping) else None
        if node is not None:
            return node
    return None


def tensor_widths(entry: TableEntry) -> TensorWidths:
    """Row widths of hidden states, top-k weights and top-k ids from the recorded contract.

    New contracts hold ``geometry.hidden_size`` and ``backend.dtypes``; historical ones
    ``hidden_dim``, ``input_dtype``, ``topk_weights_dtype`` and ``topk_ids_dtype``.
    """
    c = entry.contract
    hidden = _find(c, "geometry.hidden_size", "hidden_dim", "expert_region.hidden_dim")
    dtypes = {
        "hidden_states": _find(
            c, "backend.dtypes.hidden_states", "input_dtype", "expert_region.input_dtype"
        ),
        "topk_weights": _find(c, "backend.dtypes.topk_weights", "topk_weights_dtype"),
        "topk_ids": _find(c, "backend.dtypes.topk_ids", "topk_ids_dtype"),
    }
    where = entry.where
    if isinstance(hidden, bool) or not isinstance(hidden, int) or hidden < 1:
        raise QueryError(
            f"{where}: the contract records no hidden size, so the collectives cannot be sized"
        )
    for name, value in dtypes.items():
        if not isinstance(value, str):
            raise QueryError(
                f"{where}: the contract records no {name} dtype, so its AllGather cannot be sized"
            )
    k = entry.geometry.top_k
    source = (
        f"hidden_size={hidden} {dtypes['hidden_states']}, top-k {k} weights "
        f"{dtypes['topk_weights']}, ids {dtypes['topk_ids']}"
    )
    dispatched, scales = _dispatched_widths(c, hidden, where)
    if dispatched is not None:
        source += f"; dispatched {dispatched} B + {scales} B of scales per row"
    return TensorWidths(
        hidden_states=hidden * dtype_bytes(dtypes["hidden_states"], what="hidden_states"),
        topk_weights=k * dtype_bytes(dtypes["topk_weights"], what="topk_weights"),
        topk_ids=k * dtype_bytes(dtypes["topk_ids"], what="topk_ids"),
        source=source,
        dispatched_hidden_states=dispatched,
        dispatched_scales=scales,
    )


def _dispatched_widths(c: Mapping[str, Any], hidden: int, where: str) -> tuple[int | None, int]:
    """Per-row bytes of quantized dispatched rows and their group scales, if the contract
    records that the all-gather moves quantized activations."""
    name = _find(c, "backend.dtypes.dispatched_hidden_states")
    if name is None:
        return None, 0
    values = hidden * dtype_bytes(name, what="dispatched_hidden_states")
    scale_name = _find(c, "backend.dtypes.dispatched_scales")
    block = _find(c, "backend.quantization.weight_block_shape")
    if scale_name is None:
        return values, 0
    if not (isinstance(block, list) and len(block) == 2 and isinstance(block[1], int)):
        raise QueryError(
            f"{where}: the contract records dispatched scales but no weight_block_shape, so "
            "their width is unknown"
        )
    groups = -(-hidden // int(block[1]))
    return values, groups * dtype_bytes(scale_name, what="dispatched_scales")


@dataclass(frozen=True, slots=True)
class ComputeStep:
    """A measured component on every rank; ``rows`` says which rows it is looked up at."""

    component: str
    rows: Literal["local", "expert"]


@dataclass(frozen=True, slots=True)
class CollectiveStep:
    """One logical collective over several disjoint groups of ranks (run side by side).

    Every participant contributes (all_gather), receives (reduce_scatter) or holds
    (all_reduce) its own local rows x ``row_bytes``.
    """

    op: Literal["all_gather", "reduce_scatter", "all_reduce"]
    tensor: str
    scope: Literal["dp", "ep", "tp"]
    groups: tuple[tuple[int, ...], ...]
    row_bytes: int
    # Collectives sharing a non-empty ``launch`` (consecutive, same groups) run as one NCCL
    # group, one kernel: the trace names each logical collective, the time model charges the
    # launch once (``launch_transfer_us``).
    launch: str = ""

    @property
    def name(self) -> str:
        return f"{self.op}[{self.tensor}]"

    def kernels(self, equal: bool, participants: int) -> list[str]:
        """The NCCL calls vLLM 0.26.0 makes for this collective (all_gatherv and
        reduce_scatterv fall back to grouped broadcasts/reduces for unequal counts)."""
        if self.op == "all_reduce":
            return ["ncclAllReduce"]
        if equal:
            return ["ncclAllGather" if self.op == "all_gather" else "ncclReduceScatter"]
        call = "ncclBroadcast" if self.op == "all_gather" else "ncclReduce"
        return (
            ["ncclGroupStart"]
            + [f"{call}(root={i})" for i in range(participants)]
            + ["ncclGroupEnd"]
        )


Step = ComputeStep | CollectiveStep


@dataclass(frozen=True, slots=True)
class Trace:
    kind: Kind
    tp: int
    dp: int
    sequence_parallel: bool
    steps: tuple[Step, ...]
    widths: TensorWidths | None

    @property
    def ep(self) -> int:
        return self.tp * self.dp

    @property
    def components(self) -> tuple[str, ...]:
        return tuple(s.component for s in self.steps if isinstance(s, ComputeStep))


def deployment_kind(tp: int, dp: int, components: Sequence[str]) -> Kind:
    """Which trace a deployment runs, from its degrees and its contract's components."""
    have = set(components)
    if "wrapper" in have:
        if (tp, dp) != (1, 1):
            raise QueryError(f"a live (wrapper) table only exists at TP1/DP1, not TP{tp}/DP{dp}")
        return "live_tp1"
    if dp > 1:
        return "dp_ep_modular"
    return "dp1_modular"


_NEEDS = {
    "dp_ep_modular": ("gate_routing", EXPERTS, "finalize_copy"),
    "dp1_modular": ("gate_routing", EXPERTS),
    "live_tp1": ("gate_routing", EXPERTS, "wrapper"),
}


def build_trace(
    tp: int,
    dp: int,
    sequence_parallel: bool,
    components: Sequence[str],
    widths: TensorWidths | None,
    *,
    where: str = "bundle",
) -> Trace:
    """The dependency-ordered trace of one MoE block for a deployment (R44)."""
    kind = deployment_kind(tp, dp, components)
    missing = [c for c in _NEEDS[kind] if c not in components]
    if missing:
        raise QueryError(
            f"{where}: the {kind} trace needs {list(_NEEDS[kind])} but the bundle measures "
            f"{list(components)}: {missing} missing"
        )
    ep = tp * dp
    steps: list[Step] = [ComputeStep("gate_routing", "local")]
    if kind == "dp_ep_modular" and DISPATCH_QUANT in components:
        # FP8 activations: the native prepare quantizes the local rows before the all-gather.
        steps.append(ComputeStep(DISPATCH_QUANT, "local"))
    dp_groups = tuple(tuple(d * tp + t for d in range(dp)) for t in range(tp))
    tp_groups = tuple(tuple(d * tp + t for t in range(tp)) for d in range(dp))
    needs_widths = kind == "dp_ep_modular" or tp > 1
    if needs_widths and widths is None:
        raise QueryError(f"{where}: the trace has collectives but their widths are unknown")
    if kind == "dp_ep_modular":
        assert widths is not None
        # vLLM's AllGather/ReduceScatter dispatch runs over the DP group, or over the whole EP
        # group when the wrapper is sequence parallel (each rank holds its own 1/TP slice).
        scope: Literal["dp", "ep"] = "ep" if sequence_parallel else "dp"
        groups = (tuple(range(ep)),) if sequence_parallel else dp_groups
        gathered: list[tuple[str, int]] = [
            ("hidden_states", widths.hidden_states)
            if widths.dispatched_hidden_states is None
            else ("hidden_states", widths.dispatched_hidden_states)
        ]
        if widths.dispatched_scales:
            # vLLM gathers the scales with the rows, in the same NCCL group (extra_tensors).
            gathered.append(("activation_scales", widths.dispatched_scales))
        gathered += [("topk_weights", widths.topk_weights), ("topk_ids", widths.topk_ids)]
        for tensor, width in gathered:
            # vLLM 0.26.0 dispatches the three in one NCCL group: one kernel (two H200s).
            steps.append(
                CollectiveStep("all_gather", tensor, scope, groups, width, launch="dispatch")
            )
        steps.append(ComputeStep(EXPERTS, "expert"))
        steps.append(
            CollectiveStep("reduce_scatter", "expert_output", scope, groups, widths.hidden_states)
        )
        steps.append(ComputeStep("finalize_copy", "local"))
        if tp > 1:
            op: Literal["all_gather", "all_reduce"] = (
                "all_gather" if sequence_parallel else "all_reduce"
            )
            steps.append(CollectiveStep(op, "layer_output", "tp", tp_groups, widths.hidden_states))
    elif kind == "dp1_modular":
        steps.append(ComputeStep(EXPERTS, "expert"))
        if tp > 1:
            assert widths is not None
            steps.append(
                CollectiveStep("all_reduce", "layer_output", "tp", tp_groups, widths.hidden_states)
            )
    else:
        steps += [ComputeStep(EXPERTS, "expert"), ComputeStep("wrapper", "local")]
    return Trace(kind, tp, dp, sequence_parallel, tuple(steps), widths)


@dataclass(slots=True)
class CollectiveTiming:
    """One collective group's timing over a batch of steps."""

    step: CollectiveStep
    group: tuple[int, ...]
    bytes: IntArray  # (steps,) S as nccl-tests counts it
    shares: IntArray  # (steps, participants) bytes each participant contributes/receives
    equal: npt.NDArray[np.bool_]  # (steps,)
    start: FloatArray  # (steps,)
    transfer: FloatArray | None  # (steps,), None without a cluster
    wait: FloatArray  # (steps, participants)


def collective_bytes(
    step: CollectiveStep, group: tuple[int, ...], local_rows: IntArray
) -> tuple[IntArray, IntArray, npt.NDArray[np.bool_]]:
    """S (nccl-tests size), per-participant shares and equal-count flags for a batch."""
    shares = local_rows[:, list(group)] * step.row_bytes
    equal = (shares == shares[:, :1]).all(axis=1)
    # all_reduce: the buffer every participant holds (equal within a TP group); otherwise the
    # whole gathered tensor (all_gather) or the whole input buffer (reduce_scatter).
    size = shares[:, 0] if step.op == "all_reduce" else shares.sum(axis=1)
    return size, shares, equal


def _link_terms(
    step: CollectiveStep, n: int, size: IntArray, shares: IntArray
) -> tuple[
    tuple[str, FloatArray, FloatArray], tuple[str, list[tuple[FloatArray, FloatArray]]] | None
]:
    """The NCCL operations of one collective: for equal counts (op, link bytes, size), for
    unequal counts (single-root op, [(link bytes, size) per root]); None for all_reduce.

    Equal counts: one AllGather/ReduceScatter/AllReduce, factor(op, n) x S per link.
    Unequal counts (vLLM's all_gatherv/reduce_scatterv): one Broadcast/Reduce per root in one
    NCCL group. Each root's operation moves its share over the ring at the single-root op's
    bus bandwidth (factor 1), and the roots' operations are charged one after the other:
    on two H200s the engine's grouped broadcasts took at least the sum of the separate
    broadcasts' times, not the largest one's (docs/benchmarks.md, "grouped launches").
    """
    s = size.astype(np.float64)
    equal = (step.op, _bus_factor(step.op, n) * s, s)
    if step.op == "all_reduce":
        return equal, None
    sh = shares.astype(np.float64)
    single = "broadcast" if step.op == "all_gather" else "reduce"
    return equal, (single, [(sh[:, r], sh[:, r]) for r in range(sh.shape[1])])


def launch_transfer_us(
    cluster: Cluster,
    members: Sequence[tuple[CollectiveStep, IntArray, IntArray, npt.NDArray[np.bool_]]],
    group: tuple[int, ...],
) -> list[FloatArray]:
    """Modelled transfer of collectives launched together as one NCCL kernel, per member.

    ``members``: (step, S, shares, equal) of each logical collective of the launch over the
    same ranks (one member for a collective launched alone). vLLM 0.26.0 dispatches hidden
    states, top-k weights and top-k ids in one NCCL group: one kernel (measured on two H200s),
    and an unequal-count gather or reduce is itself a group of one operation per root. The
    launch pays one latency (the largest alpha of its operations), ``group_op_us`` for every
    operation beyond the first, and the bytes of every operation, each at the bandwidth of its
    own size (NCCL picks a protocol per operation). The latency and the per-operation costs
    are charged to the first member, each member carries its own bytes, so the members add up
    to the launch's time. With several candidate link classes the slowest (the largest launch
    time) times the launch, per step.
    """
    n = len(group)
    terms = [_link_terms(step, n, size, shares) for step, size, shares, _ in members]
    per_class: list[list[FloatArray]] = []
    for link in cluster.classes_for(group):
        alpha: FloatArray | None = None
        ops: FloatArray | None = None
        parts: list[FloatArray] = []
        for (_, _, _, equal), ((eop, elink, esize), unequal) in zip(members, terms, strict=True):
            p_eq = link.collectives[eop]
            a = np.full(equal.shape, p_eq.alpha_us)
            b = p_eq.bytes_us(elink, esize)
            count = np.ones(equal.shape)
            if unequal is not None and not equal.all():
                uop, roots = unequal
                p_un = link.collectives[uop]
                a = np.where(equal, a, p_un.alpha_us)
                b = np.where(equal, b, np.sum([p_un.bytes_us(lb, sz) for lb, sz in roots], axis=0))
                count = np.where(equal, 1.0, float(len(roots)))
            alpha = a if alpha is None else np.maximum(alpha, a)
            ops = count if ops is None else ops + count
            parts.append(b)
        assert alpha is not None and ops is not None
        parts[0] = parts[0] + alpha + link.group_op_us * (ops - 1.0)
        per_class.append(parts)
    if len(per_class) == 1:
        return per_class[0]
    totals = np.stack([np.sum(parts, axis=0) for parts in per_class])
    pick = np.argmax(totals, axis=0)
    return [np.choose(pick, [parts[j] for parts in per_class]) for j in range(len(members))]


def transfer_us(
    cluster: Cluster,
    step: CollectiveStep,
    group: tuple[int, ...],
    size: IntArray,
    shares: IntArray,
    equal: npt.NDArray[np.bool_],
) -> FloatArray:
    """Modelled transfer of one collective launched alone, for a batch of steps.

    Equal counts: one AllGather/ReduceScatter/AllReduce of S bytes. Unequal counts: vLLM's
    all_gatherv/reduce_scatterv, one Broadcast/Reduce per root in one NCCL group: one
    latency, ``group_op_us`` per further root, every root's share (``launch_transfer_us``).
    """
    return launch_transfer_us(cluster, [(step, size, shares, equal)], group)[0]


def launch_runs(steps: Sequence[Step]) -> list[tuple[int, ...]]:
    """Per trace step, the indices of the steps launched with it (itself alone if none).

    Consecutive collectives with the same non-empty ``launch`` over the same groups form one
    launch; a compute step is its own.
    """
    out: list[tuple[int, ...]] = []
    i = 0
    while i < len(steps):
        j = i + 1
        first = steps[i]
        if isinstance(first, CollectiveStep) and first.launch:
            while (
                j < len(steps)
                and isinstance(steps[j], CollectiveStep)
                and steps[j].launch == first.launch  # type: ignore[union-attr]
                and steps[j].groups == first.groups  # type: ignore[union-attr]
            ):
                j += 1
        run = tuple(range(i, j))
        out += [run] * len(run)
        i = j
    return out
