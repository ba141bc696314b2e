"""The MoE layer estimate: routing, measured components, collectives and the worst rank.

One step's per-DP-rank token counts go through a routing policy (`moetables.routing`) to every
EP rank's (local rows, N, A, M); each rank's components are looked up in its own deployment
table; the block trace (`moetables.comm`) orders them with the collectives; a cluster
description times the collectives. A collective starts when its last participant arrives, so
each rank's time is compute + wait + transfer and the layer ends with the last rank (R44, R45).

Everything is computed over arrays of steps, so a batch of many steps costs about as much as a
few batch lookups; a single estimate is a batch of one.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from moetables.bundle.model import EXPERTS, TableEntry
from moetables.comm import (
    Cluster,
    CollectiveStep,
    ComputeStep,
    Trace,
    build_trace,
    collective_bytes,
    launch_runs,
    launch_transfer_us,
    tensor_widths,
)
from moetables.errors import CoverageError, QueryError
from moetables.geometry import MoeTarget
from moetables.lookup.codes import INVALID, OK, OUT_OF_SUPPORT
from moetables.profiles import RoutingProfile
from moetables.routing import ActiveCurve, BatchRouting, Deployment, route_batch
from moetables.tiles import MAX_TILE_COST_US, valid_tile_cost
from moetables.triton_config import KernelShape
from moetables.waves import LoadCharge


# What the estimate reads of the lookup tables, as protocols: `moetables.lookup.tables` calls
# into this module for its `estimate` methods, so naming its classes here would close a circle.
class _Answers(Protocol):
    @property
    def time_us(self) -> npt.NDArray[np.float64]: ...

    @property
    def code(self) -> npt.NDArray[Any]: ...


class DeploymentTables(Protocol):
    """One rank's tables (`moetables.lookup.DeploymentTables`)."""

    @property
    def entry(self) -> TableEntry: ...

    @property
    def time_us(self) -> Callable[..., float]: ...

    def batch(
        self,
        component: str,
        tokens: npt.ArrayLike,
        activated_experts: npt.ArrayLike | None = None,
        local_assignments: npt.ArrayLike | None = None,
        mode: str = "eager",
    ) -> _Answers: ...

    def answer(self, queries: Sequence[Any]) -> list[dict[str, Any]]: ...

    def tile_shape(self) -> KernelShape: ...

    @property
    def fitted_tile_cost_us(self) -> float | None: ...

    @property
    def tile_block_m(self) -> int: ...

    def tile_cost_at(self, block_m: int) -> float | None: ...

    def tile_charge_us(self, block_m: int, tile_cost_us: float | None) -> float | None: ...

    def charge_at(self, block_m: int, tile_cost_us: float | None) -> LoadCharge | None: ...

    def charged_units(
        self, charge: LoadCharge, tokens: npt.ArrayLike, tiles: npt.ArrayLike
    ) -> npt.NDArray[np.float64]: ...

    def balanced_units_batch(
        self,
        charge: LoadCharge,
        tokens: npt.ArrayLike,
        activated_experts: npt.ArrayLike,
        local_assignments: npt.ArrayLike,
        mode: str = "eager",
    ) -> _Answers: ...

    def balanced_tiles_batch(
        self,
        tokens: npt.ArrayLike,
        activated_experts: npt.ArrayLike,
        local_assignments: npt.ArrayLike,
        mode: str = "eager",
    ) -> _Answers: ...


class ComponentTables(Protocol):
    """A bundle's tables (`moetables.lookup.ComponentTables`)."""

    def deployment(
        self, tp: int, dp: int, rank: int, sequence_parallel: bool = False
    ) -> DeploymentTables: ...


__all__ = [
    "ESTIMATE_OPTIONS",
    "MODES",
    "BatchEstimate",
    "CollectiveEstimate",
    "LayerEstimate",
    "LayerEstimator",
    "RankEstimate",
    "StepArrays",
    "TraceEvent",
    "capture_sizes_of",
    "check_estimate_options",
    "checked_capture_sizes",
    "own_deployment",
    "pad_to_capture",
    "unmeasured_block_work",
]

MODES = ("eager", "graph")
# Issue 18: ``tile_cost_us="table"`` charges each rank at its own table's fitted tile cost.
TABLE_TILE_COST = "table"
# The default: a step whose policy gives per-expert counts is answered for the loads it had
# (charged as "table") where every rank's table records a tile model; elsewhere, and for the
# policies without counts, nothing is charged. "none" (or None) charges nothing.
AUTO_TILE_COST = "auto"
NO_TILE_COST = "none"
TILE_COST_WORDS = (AUTO_TILE_COST, TABLE_TILE_COST, NO_TILE_COST)
# Batches of at most this many steps look components up one by one (scalar, cached).
_FEW = 4
FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


# The keyword options of ComponentTables.estimate / estimate_batch (and the REST request's).
ESTIMATE_OPTIONS = frozenset(
    {
        "expert_counts",
        "active_curve",
        "load_shares",
        "seed",
        "capture_sizes",
        "profile",
        "layer",
        "captured_expectation",
        "tile_cost_us",
        "first_step",
    }
)


def check_estimate_options(options: Mapping[str, Any], call: str = "estimate") -> None:
    """TypeError naming an unknown keyword and the known ones (Python's own message names
    neither the method the user called nor what it takes)."""
    unknown = sorted(set(options) - ESTIMATE_OPTIONS)
    if unknown:
        raise TypeError(
            f"{call}() got an unexpected keyword argument {unknown[0]!r}; its options are "
            f"{sorted(ESTIMATE_OPTIONS)}"
        )


def own_deployment(target: MoeTarget, options: dict[str, Any]) -> None:
    """A rank's tables (in process or a registry's) estimate the deployment they belong to: a
    ``tp``, ``dp`` or ``sequence_parallel`` in ``options`` that says the same is dropped,
    another one is refused by name."""
    own = {"tp": target.tp, "dp": target.dp, "sequence_parallel": target.sequence_parallel}
    for key, value in own.items():
        if key not in options:
            continue
        given = options.pop(key)
        if given != value or isinstance(given, bool) != isinstance(value, bool):
            raise QueryError(
                f"these tables are rank {target.rank} of TP{target.tp}/DP{target.dp} "
                f"(sequence_parallel={target.sequence_parallel}) and estimate that deployment; "
                f"got {key}={given!r}: for another deployment call "
                "ComponentTables.estimate(tokens, tp=..., dp=...)"
            )


def checked_capture_sizes(capture_sizes: object) -> list[int]:
    """The capture sizes sorted and deduplicated; QueryError unless a non-empty sequence of
    positive integers (a bool, a float or a string is a caller's mistake, not a size)."""
    if isinstance(capture_sizes, (str, bytes)) or not isinstance(
        capture_sizes, (Sequence, np.ndarray)
    ):
        raise QueryError(
            f"capture sizes must be a non-empty list of positive integers, got {capture_sizes!r}"
        )
    values = list(capture_sizes)
    if (
        not values
        or any(
            isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)) for v in values
        )
        or min(values) < 1
    ):
        raise QueryError(f"capture sizes must be positive integers, got {values!r}")
    return sorted({int(v) for v in values})


def pad_to_capture(
    tokens_per_rank: Sequence[int], capture_sizes: Sequence[int]
) -> tuple[list[int], bool]:
    """Per-DP-rank counts as a CUDA-graph step runs them, and whether it runs as a graph.

    vLLM pads a batch to the smallest capture size that holds it, and with DP every rank runs
    the largest padded size of the step (the graph batch is one size on every DP rank). A step
    where some rank exceeds the largest capture size runs eagerly: counts stay as given.
    """
    sizes = checked_capture_sizes(capture_sizes)
    counts = [int(n) for n in tokens_per_rank]
    if any(n < 1 for n in counts):
        raise QueryError(f"token counts must be at least 1, got {counts}")
    if max(counts) > sizes[-1]:
        return counts, False
    padded = [next(s for s in sizes if s >= n) for n in counts]
    top = max(padded)
    return [top] * len(counts), True


def unmeasured_block_work(entry_contract: Mapping[str, Any]) -> tuple[str, ...]:
    """Notes for work of the model's MoE block that no component of these tables holds.

    A modular table of a shared-expert model times the routed path only; its contract says so
    (``backend.shared_experts.measured: false``), and every answer repeats it, since the layer
    time then leaves the shared expert out.
    """
    backend = entry_contract.get("backend")
    shared = backend.get("shared_experts") if isinstance(backend, Mapping) else None
    if not isinstance(shared, Mapping) or shared.get("measured") is not False:
        return ()
    return (
        f"the model's shared expert (count {shared.get('count')}, width "
        f"{shared.get('intermediate_size')}, gate {shared.get('gate')}) is in none of these "
        "tables (contract backend.shared_experts): this layer time leaves it out; a vllm-live "
        "table (TP1) holds it in its wrapper rows",
    )


def capture_sizes_of(entry_contract: Mapping[str, Any]) -> list[int] | None:
    """The serving capture sizes a contract records (``sampling_graph.source``), if any."""
    node: Any = entry_contract
    for part in ("sampling_graph", "source", "capture_sizes", "sizes"):
        node = node.get(part) if isinstance(node, Mapping) else None
    if isinstance(node, list) and node and all(type(s) is int and s > 0 for s in node):
        return list(node)
    return None


@dataclass(frozen=True, slots=True)
class TraceEvent:
    """One rank's part in one trace step: compute, or a collective (arrive, wait, transfer)."""

    rank: int
    name: str
    kind: str  # "compute" or "collective"
    # Times from the layer's start. Without a cluster transfers are unknown and the timeline
    # leaves them out (the answer's notes say so).
    start_us: float  # when the rank reached this step
    end_us: float
    wait_us: float
    transfer_us: float | None
    bytes: int | None


@dataclass(frozen=True, slots=True)
class CollectiveEstimate:
    op: str
    tensor: str
    scope: str
    ranks: tuple[int, ...]
    bytes: int  # S as nccl-tests counts it
    bytes_by_rank: tuple[int, ...]
    equal_counts: bool
    vllm_call: str
    kernels: tuple[str, ...]
    launch: str  # collectives of one launch run as one NCCL kernel ("" when launched alone)
    start_us: float
    transfer_us: float | None
    wait_us: float  # the earliest participant's wait (the worst-rank envelope)
    wait_by_rank: tuple[float, ...]


@dataclass(frozen=True, slots=True)
class RankEstimate:
    rank: int
    dp_rank: int
    tp_rank: int
    tokens: int  # this rank's DP count (padded)
    local_rows: int
    N: int
    A: int
    M: int
    components: Mapping[str, float]
    compute_us: float
    wait_us: float
    transfer_us: float | None
    end_us: float | None
    # Counting policies (histogram, round_robin, random): the rank's pairs per local expert,
    # global experts [expert_range[0], expert_range[1]) in its linear expert map's order.
    expert_counts: tuple[int, ...] | None = None
    expert_range: tuple[int, int] | None = None


@dataclass(frozen=True, slots=True)
class LayerEstimate:
    kind: str
    tp: int
    dp: int
    sequence_parallel: bool
    policy: str
    mode: str
    table_mode: str
    tokens: tuple[int, ...]  # as given
    padded_tokens: tuple[int, ...]  # as the step runs
    ranks: tuple[RankEstimate, ...]
    collectives: tuple[CollectiveEstimate, ...]
    events: tuple[TraceEvent, ...]
    layer_us: float | None  # None without a cluster: transfers are unknown
    layer_compute_us: float  # compute and waits only (transfers left out)
    critical_rank: int
    cluster: str | None
    notes: tuple[str, ...] = field(default=())

    def as_dict(self, *, expert_counts: bool = False) -> dict[str, Any]:
        """The JSON answer of the CLI and REST API; ``expert_counts`` adds each rank's pairs
        per local expert (counting policies only: an error otherwise)."""
        if expert_counts and any(r.expert_counts is None for r in self.ranks):
            raise QueryError(_NO_COUNTS.format(policy=self.policy))
        answer: dict[str, Any] = {
            "deployment": {
                "tp": self.tp,
                "dp": self.dp,
                "ep": self.tp * self.dp,
                "sequence_parallel": self.sequence_parallel,
                "kind": self.kind,
            },
            "policy": self.policy,
            "mode": self.mode,
            "table_mode": self.table_mode,
            "tokens": list(self.tokens),
            "padded_tokens": list(self.padded_tokens),
            "cluster": self.cluster,
            "ranks": [
                {
                    "rank": r.rank,
                    "dp_rank": r.dp_rank,
                    "tp_rank": r.tp_rank,
                    "tokens": r.tokens,
                    "local_rows": r.local_rows,
                    "N": r.N,
                    "A": r.A,
                    "M": r.M,
                    "components": dict(r.components),
                    "compute_us": r.compute_us,
                    "wait_us": r.wait_us,
                    "transfer_us": r.transfer_us,
                    "end_us": r.end_us,
                    **(
                        {
                            "expert_range": list(r.expert_range or ()),
                            "expert_counts": list(r.expert_counts or ()),
                        }
                        if expert_counts
                        else {}
                    ),
                }
                for r in self.ranks
            ],
            "collectives": [
                {
                    "op": c.op,
                    "tensor": c.tensor,
                    "scope": c.scope,
                    "ranks": list(c.ranks),
                    "bytes": c.bytes,
                    "bytes_by_rank": list(c.bytes_by_rank),
                    "equal_counts": c.equal_counts,
                    "vllm_call": c.vllm_call,
                    "kernels": list(c.kernels),
                    "launch": c.launch,
                    "start_us": c.start_us,
                    "transfer_us": c.transfer_us,
                    "wait_us": c.wait_us,
                    "wait_by_rank": list(c.wait_by_rank),
                }
                for c in self.collectives
            ],
            "events": [
                {
                    "rank": e.rank,
                    "name": e.name,
                    "kind": e.kind,
                    "start_us": e.start_us,
                    "end_us": e.end_us,
                    "wait_us": e.wait_us,
                    "transfer_us": e.transfer_us,
                    "bytes": e.bytes,
                }
                for e in self.events
            ],
            "layer_us": self.layer_us,
            "layer_compute_us": self.layer_compute_us,
            "critical_rank": self.critical_rank,
            "notes": list(self.notes),
        }
        return answer


@dataclass(slots=True)
class StepArrays:
    """Per trace step, arrays over (steps, ep): arrival, start, end; collectives' extras.
    Public for `moetables.estimate_json`, which rebuilds them from a registry's answers."""

    arrive: FloatArray
    start: FloatArray
    end: FloatArray
    collectives: list[Any]  # CollectiveTiming-like tuples per group


@dataclass(slots=True)
class BatchEstimate:
    """Many steps at once. Arrays have shape (steps,) or (steps, ep); refused steps carry a
    non-OK ``code`` and NaN times, with their messages in ``errors``."""

    trace: Trace
    routing: BatchRouting
    policy: str
    mode: str
    table_mode: str
    tokens: IntArray  # (steps, dp) as given
    components: dict[str, FloatArray]  # component -> (steps, ep)
    compute_us: FloatArray
    wait_us: FloatArray
    transfer_us: FloatArray | None
    layer_us: FloatArray | None
    layer_compute_us: FloatArray
    code: npt.NDArray[np.int8]
    errors: dict[int, str]
    cluster: str | None
    notes: tuple[str, ...]
    graph: npt.NDArray[np.bool_] | None = None
    # Each step's notes where they differ between steps (a tile charge names the blocks its
    # step ran); None: every step's are ``notes``.
    step_notes: list[tuple[str, ...]] | None = None
    _steps: list[StepArrays] | None = None

    def notes_of(self, i: int) -> tuple[str, ...]:
        """Step ``i``'s notes (without the graph-mode note of a step that ran eagerly)."""
        return self.notes if self.step_notes is None else self.step_notes[i]

    def __len__(self) -> int:
        return int(self.code.shape[0])

    def step(self, i: int) -> LayerEstimate:
        """Step ``i`` as a typed result; a refused step raises its error."""
        if self.code[i] != OK:
            error = CoverageError if self.code[i] == OUT_OF_SUPPORT else QueryError
            raise error(self.errors.get(i, "refused"))
        trace = self.trace
        r = self.routing
        ep = trace.ep
        ranks = []
        for rank in range(ep):
            counts = None
            expert_range = None
            if r.expert_counts is not None:
                start, stop = _ranges(trace, r)[rank]
                counts = tuple(int(c) for c in r.expert_counts[i, start:stop])
                expert_range = (start, stop)
            end = float(self._steps[-1].end[i, rank]) if self._steps is not None else None
            ranks.append(
                RankEstimate(
                    rank=rank,
                    dp_rank=rank // trace.tp,
                    tp_rank=rank % trace.tp,
                    tokens=int(r.padded_tokens[i, rank // trace.tp]),
                    local_rows=int(r.local_rows[i, rank]),
                    N=int(r.tokens[i]),
                    A=int(r.activated_experts[i, rank]),
                    M=int(r.local_assignments[i, rank]),
                    components={c: float(v[i, rank]) for c, v in self.components.items()},
                    compute_us=float(self.compute_us[i, rank]),
                    wait_us=float(self.wait_us[i, rank]),
                    transfer_us=(
                        float(self.transfer_us[i, rank]) if self.transfer_us is not None else None
                    ),
                    end_us=end,
                    expert_counts=counts,
                    expert_range=expert_range,
                )
            )
        collectives: list[CollectiveEstimate] = []
        events: list[TraceEvent] = []
        assert self._steps is not None
        for tstep, arrays in zip(trace.steps, self._steps, strict=True):
            if isinstance(tstep, ComputeStep):
                for rank in range(ep):
                    events.append(
                        TraceEvent(
                            rank,
                            tstep.component,
                            "compute",
                            float(arrays.start[i, rank]),
                            float(arrays.end[i, rank]),
                            0.0,
                            None,
                            None,
                        )
                    )
                continue
            for group, size, shares, equal, start, transfer, wait in arrays.collectives:
                eq = bool(equal[i])
                tr = float(transfer[i]) if transfer is not None else None
                collectives.append(
                    CollectiveEstimate(
                        op=tstep.op,
                        tensor=tstep.tensor,
                        scope=tstep.scope,
                        ranks=group,
                        bytes=int(size[i]),
                        bytes_by_rank=tuple(int(s) for s in shares[i]),
                        equal_counts=eq,
                        vllm_call=_vllm_call(tstep.op, eq),
                        kernels=tuple(tstep.kernels(eq, len(group))),
                        launch=tstep.launch,
                        start_us=float(start[i]),
                        transfer_us=tr,
                        wait_us=float(wait[i].max()),
                        wait_by_rank=tuple(float(w) for w in wait[i]),
                    )
                )
                for j, rank in enumerate(group):
                    events.append(
                        TraceEvent(
                            rank,
                            tstep.name,
                            "collective",
                            float(arrays.arrive[i, rank]),
                            float(arrays.end[i, rank]),
                            float(wait[i, j]),
                            tr,
                            int(shares[i, j]),
                        )
                    )
        layer = float(self.layer_us[i]) if self.layer_us is not None else None
        finals = self._steps[-1].end[i]
        return LayerEstimate(
            kind=trace.kind,
            tp=trace.tp,
            dp=trace.dp,
            sequence_parallel=trace.sequence_parallel,
            policy=self.policy,
            mode=self.mode,
            table_mode=self._table_mode(i),
            tokens=tuple(int(n) for n in self.tokens[i]),
            padded_tokens=tuple(int(n) for n in r.padded_tokens[i]),
            ranks=tuple(ranks),
            collectives=tuple(collectives),
            events=tuple(events),
            layer_us=layer,
            layer_compute_us=float(self.layer_compute_us[i]),
            critical_rank=int(np.argmax(finals)),
            cluster=self.cluster,
            notes=self.notes_of(i)
            + (
                ("graph mode: this step exceeds the largest capture size and runs eagerly",)
                if self.graph is not None and not self.graph[i]
                else ()
            ),
        )

    def _table_mode(self, i: int) -> str:
        """The tables step ``i`` read: eager where a graph-mode step ran eagerly."""
        if self.graph is not None and not self.graph[i]:
            return "eager"
        return self.table_mode

    def as_dicts(self, *, events: bool = True, expert_counts: bool = False) -> list[dict[str, Any]]:
        """One JSON answer per step (`LayerEstimate.as_dict`, without ``events`` when asked,
        with each rank's per-expert counts when asked), refusals as ``{"error", "message"}``.
        Built from the arrays converted once, not step by step: this is what a request of
        many steps costs."""
        trace, r = self.trace, self.routing
        if expert_counts and r.expert_counts is None:
            raise QueryError(_NO_COUNTS.format(policy=self.policy))
        by_expert = tolist_counts = None
        if expert_counts:
            assert r.expert_counts is not None
            by_expert = _ranges(trace, r)
            tolist_counts = r.expert_counts.tolist()
        ep, steps_ = trace.ep, len(self)
        assert self._steps is not None
        tolist = np.ndarray.tolist
        local_rows, n_, a_, m_ = (
            tolist(x) for x in (r.local_rows, r.tokens, r.activated_experts, r.local_assignments)
        )
        padded, given = tolist(r.padded_tokens), tolist(self.tokens)
        comps = {c: tolist(v) for c, v in self.components.items()}
        compute, wait = tolist(self.compute_us), tolist(self.wait_us)
        transfer = tolist(self.transfer_us) if self.transfer_us is not None else None
        layer = tolist(self.layer_us) if self.layer_us is not None else None
        layer_compute = tolist(self.layer_compute_us)
        ends = tolist(self._steps[-1].end)
        critical = tolist(np.argmax(self._steps[-1].end, axis=1))
        code = tolist(self.code)
        deployment = {
            "tp": trace.tp,
            "dp": trace.dp,
            "ep": ep,
            "sequence_parallel": trace.sequence_parallel,
            "kind": trace.kind,
        }
        eager_note = "graph mode: this step exceeds the largest capture size and runs eagerly"
        graph = tolist(self.graph) if self.graph is not None else None
        # Per trace step, lists once: compute (start, end) or collective groups.
        walked: list[Any] = []
        for tstep, arrays in zip(trace.steps, self._steps, strict=True):
            if isinstance(tstep, ComputeStep):
                walked.append((tstep, tolist(arrays.start), tolist(arrays.end), None))
                continue
            groups = []
            for group, size, shares, equal, start, tr, w in arrays.collectives:
                groups.append(
                    (
                        group,
                        tolist(size),
                        tolist(shares),
                        tolist(equal),
                        tolist(start),
                        tolist(tr) if tr is not None else None,
                        tolist(w),
                    )
                )
            walked.append((tstep, tolist(arrays.arrive), tolist(arrays.end), groups))
        out: list[dict[str, Any]] = []
        for i in range(steps_):
            if code[i] != OK:
                kind = "out_of_support" if code[i] == OUT_OF_SUPPORT else "invalid"
                out.append({"error": kind, "message": self.errors.get(i, "refused")})
                continue
            ranks = [
                {
                    "rank": k,
                    "dp_rank": k // trace.tp,
                    "tp_rank": k % trace.tp,
                    "tokens": padded[i][k // trace.tp],
                    "local_rows": local_rows[i][k],
                    "N": n_[i],
                    "A": a_[i][k],
                    "M": m_[i][k],
                    "components": {c: v[i][k] for c, v in comps.items()},
                    "compute_us": compute[i][k],
                    "wait_us": wait[i][k],
                    "transfer_us": transfer[i][k] if transfer is not None else None,
                    "end_us": ends[i][k],
                }
                for k in range(ep)
            ]
            if by_expert is not None and tolist_counts is not None:
                for k, rank in enumerate(ranks):
                    start, stop = by_expert[k]
                    rank["expert_range"] = [start, stop]
                    rank["expert_counts"] = tolist_counts[i][start:stop]
            collectives = []
            event_list: list[dict[str, Any]] = []
            for tstep, first, last, groups in walked:
                if groups is None:
                    if events:
                        event_list += [
                            {
                                "rank": k,
                                "name": tstep.component,
                                "kind": "compute",
                                "start_us": first[i][k],
                                "end_us": last[i][k],
                                "wait_us": 0.0,
                                "transfer_us": None,
                                "bytes": None,
                            }
                            for k in range(ep)
                        ]
                    continue
                for group, size, shares, equal, start, tr, w in groups:
                    eq = equal[i]
                    t = tr[i] if tr is not None else None
                    collectives.append(
                        {
                            "op": tstep.op,
                            "tensor": tstep.tensor,
                            "scope": tstep.scope,
                            "ranks": list(group),
                            "bytes": size[i],
                            "bytes_by_rank": shares[i],
                            "equal_counts": eq,
                            "vllm_call": _vllm_call(tstep.op, eq),
                            "kernels": tstep.kernels(eq, len(group)),
                            "launch": tstep.launch,
                            "start_us": start[i],
                            "transfer_us": t,
                            "wait_us": max(w[i]),
                            "wait_by_rank": w[i],
                        }
                    )
                    if events:
                        event_list += [
                            {
                                "rank": k,
                                "name": tstep.name,
                                "kind": "collective",
                                "start_us": first[i][k],
                                "end_us": last[i][k],
                                "wait_us": w[i][j],
                                "transfer_us": t,
                                "bytes": shares[i][j],
                            }
                            for j, k in enumerate(group)
                        ]
            notes = list(self.notes_of(i))
            if graph is not None and not graph[i]:
                notes.append(eager_note)
            answer: dict[str, Any] = {
                "deployment": dict(deployment),
                "policy": self.policy,
                "mode": self.mode,
                "table_mode": self._table_mode(i),
                "tokens": given[i],
                "padded_tokens": padded[i],
                "cluster": self.cluster,
                "ranks": ranks,
                "collectives": collectives,
            }
            if events:
                answer["events"] = event_list
            answer.update(
                {
                    "layer_us": layer[i] if layer is not None else None,
                    "layer_compute_us": layer_compute[i],
                    "critical_rank": critical[i],
                    "notes": notes,
                }
            )
            out.append(answer)
        return out


def _ranges(trace: Trace, routing: BatchRouting) -> list[tuple[int, int]]:
    assert routing.expert_counts is not None
    e = routing.expert_counts.shape[1]
    base, extra = divmod(e, trace.ep)
    out = []
    for rank in range(trace.ep):
        start = rank * base + min(rank, extra)
        out.append((start, start + base + (1 if rank < extra else 0)))
    return out


_NO_COUNTS = (
    "per-expert counts per rank: the {policy} policy gives none; histogram, round_robin and "
    "random do"
)


def _vllm_call(op: str, equal: bool) -> str:
    if op == "all_reduce":
        return "all_reduce"
    base = "all_gatherv" if op == "all_gather" else "reduce_scatterv"
    return base + (" (equal counts)" if equal else " (unequal counts)")


class LayerEstimator:
    """Every rank's tables of one deployment, its trace and geometry, ready to estimate."""

    def __init__(
        self, tables: ComponentTables, tp: int, dp: int, sequence_parallel: bool = False
    ) -> None:
        self.tp, self.dp, self.sequence_parallel = tp, dp, sequence_parallel
        ep = tp * dp
        self.ranks: list[DeploymentTables] = []
        for rank in range(ep):
            try:
                self.ranks.append(tables.deployment(tp, dp, rank, sequence_parallel))
            except CoverageError as exc:
                raise CoverageError(
                    f"the TP{tp}/DP{dp} layer needs every rank's table; rank {rank}: {exc}"
                ) from None
        first = self.ranks[0].entry
        components = first.components
        for d in self.ranks[1:]:
            if d.entry.components != components:
                raise QueryError(
                    f"ranks of TP{tp}/DP{dp} measure different components: "
                    f"{list(components)} vs {list(d.entry.components)} ({d.entry.where})"
                )
        g = first.geometry
        self.deployment = Deployment(tp, dp, sequence_parallel, g.global_experts, g.top_k)
        widths = None
        if dp > 1 or tp > 1:
            widths = tensor_widths(first)
        self.trace = build_trace(tp, dp, sequence_parallel, components, widths, where=first.where)
        self.modes = set(first.modes)
        for d in self.ranks[1:]:
            self.modes &= set(d.entry.modes)
        self.capture_sizes = capture_sizes_of(first.contract)
        self.block_notes = unmeasured_block_work(first.contract)

    def estimate(
        self,
        tokens_per_rank: Sequence[int],
        *,
        policy: str = "balanced",
        cluster: Cluster | None = None,
        mode: str = "eager",
        expert_counts: Sequence[int] | None = None,
        active_curve: ActiveCurve | object = None,
        load_shares: Sequence[float] | None = None,
        seed: int = 0,
        capture_sizes: Sequence[int] | None = None,
        profile: RoutingProfile | None = None,
        layer: int | None = None,
        captured_expectation: bool = False,
        tile_cost_us: float | str | None = AUTO_TILE_COST,
        first_step: int = 0,
    ) -> LayerEstimate:
        """One step's layer estimate; a refusal raises naming the rank and component."""
        if isinstance(tokens_per_rank, (str, bytes)) or not isinstance(tokens_per_rank, Sequence):
            raise QueryError("tokens_per_rank must be a list of integers, one per DP rank")
        if any(isinstance(n, (bool, np.bool_)) for n in tokens_per_rank):
            raise QueryError(f"token counts must be integers, got {list(tokens_per_rank)!r}")
        batch = self.estimate_batch(
            [list(tokens_per_rank)],
            policy=policy,
            cluster=cluster,
            mode=mode,
            expert_counts=None if expert_counts is None else [list(expert_counts)],
            active_curve=active_curve,
            load_shares=load_shares,
            seed=seed,
            capture_sizes=capture_sizes,
            profile=profile,
            layer=layer,
            captured_expectation=captured_expectation,
            tile_cost_us=tile_cost_us,
            first_step=first_step,
        )
        return batch.step(0)

    def estimate_batch(
        self,
        tokens_per_rank: Any,
        *,
        policy: str = "balanced",
        cluster: Cluster | None = None,
        mode: str = "eager",
        expert_counts: Any = None,
        active_curve: ActiveCurve | object = None,
        load_shares: Sequence[float] | None = None,
        seed: int = 0,
        capture_sizes: Sequence[int] | None = None,
        profile: RoutingProfile | None = None,
        layer: int | None = None,
        captured_expectation: bool = False,
        tile_cost_us: float | str | None = AUTO_TILE_COST,
        first_step: int = 0,
    ) -> BatchEstimate:
        """Many steps: ``tokens_per_rank`` of shape (steps, dp); ``expert_counts`` (steps, E)
        for the histogram policy. Input errors raise; lookups outside measured support are
        per-step refusals (``code``, ``errors``).

        ``tile_cost_us`` (issue 18) charges every rank's expert kernel for the row tiles its
        per-expert counts run beyond the balanced tiles its table embodies (`moetables.tiles`):
        a number, that many microseconds per tile where vLLM's block is at least the rank's
        ``tile_block_m`` rows (its tile model's ``block_m``, else 128); ``"table"``, each rank at
        its own table's recorded model (refused for a rank without one); both need a counting
        policy (histogram, round_robin, random, captured draws). ``"auto"`` (the default):
        ``"table"`` where the policy gives per-expert counts and every rank's table records a
        model, nothing elsewhere (a note says which); ``"none"`` or None: nothing, the
        balanced-load answer of the tables at each rank's (N, A, M).

        ``first_step``: the seeded policies draw step i of this call from the stream
        (seed, first_step + i), so a run asked a chunk or a step at a time gets the same draws
        as one call for all of it."""
        if mode not in MODES:
            raise QueryError(f"mode must be one of {list(MODES)}, got {mode!r}")
        if cluster is not None and not isinstance(cluster, Cluster):
            raise QueryError("cluster must be a loaded Cluster (moetables.comm.load_cluster)")
        notes: list[str] = list(self.block_notes)
        try:
            counts = np.asarray(tokens_per_rank)
        except (ValueError, TypeError):
            raise QueryError(
                "tokens_per_rank must be steps of one integer per DP rank "
                f"({self.dp}), all of the same length"
            ) from None
        given = counts
        graph = None
        table_mode = "eager"
        if mode == "graph":
            sizes = capture_sizes if capture_sizes is not None else self.capture_sizes
            if sizes is None:
                raise QueryError(
                    "graph mode needs the serving capture sizes: this bundle's contract records "
                    "none, so pass capture_sizes"
                )
            sizes = checked_capture_sizes(sizes)
            padded = []
            flags = []
            for row in np.atleast_2d(counts).tolist():
                p, g = pad_to_capture(row, sizes)
                padded.append(p)
                flags.append(g)
            counts = np.array(padded, dtype=np.int64)
            graph = np.array(flags, dtype=bool)
            if "graph" in self.modes:
                table_mode = "graph"
            else:
                notes.append(
                    "graph mode: this bundle holds eager timings only; they are read at the "
                    "graph-padded rows (the method's rule for new eager tables)"
                )
        elif "eager" not in self.modes:
            raise QueryError(f"this deployment measures modes {sorted(self.modes)}, not eager")
        routing = route_batch(
            self.deployment,
            counts,
            policy,
            expert_counts=expert_counts,
            active_curve=active_curve,
            load_shares=load_shares,
            seed=seed,
            profile=profile,
            layer=layer,
            captured_expectation=captured_expectation,
            first_step=first_step,
        )
        steps, ep = routing.local_rows.shape
        code = np.full(steps, OK, dtype=np.int8)
        errors: dict[int, str] = {}
        components: dict[str, FloatArray] = {}
        # Steps that run eagerly in graph mode (past the largest capture size) read the eager
        # tables; the others read the tables of the mode they run in.
        parts: list[tuple[str, npt.NDArray[np.intp] | None]] = [(table_mode, None)]
        if graph is not None and table_mode == "graph" and not graph.all():
            parts = [("graph", np.flatnonzero(graph)), ("eager", np.flatnonzero(~graph))]
        for component in self.trace.components:
            times = np.empty((steps, ep), dtype=np.float64)
            for rank, tables in enumerate(self.ranks):
                for part_mode, rows in parts:
                    self._lookup(
                        tables, rank, component, part_mode, routing, rows, times, code, errors
                    )
            components[component] = times
        per_step: tuple[int, list[str]] | None = None
        cost = self._tile_cost(tile_cost_us, routing, notes)
        if cost is not None:
            per_step = self._charge_tiles(routing, components, cost, table_mode, notes)
        return self._time(
            routing,
            components,
            code,
            errors,
            cluster,
            policy,
            mode,
            table_mode,
            np.atleast_2d(given),
            tuple(notes),
            graph,
            per_step,
        )

    def _ranks_without_tile_model(self) -> list[int]:
        return [r for r, t in enumerate(self.ranks) if t.fitted_tile_cost_us is None]

    def _tile_cost(
        self, given: float | str | None, routing: BatchRouting, notes: list[str]
    ) -> float | str | None:
        """What ``tile_cost_us`` charges for this routing: a number, ``"table"`` or nothing."""
        if given is None or given == NO_TILE_COST:
            return None
        if given != AUTO_TILE_COST:
            return given
        if routing.expert_counts is None:
            return None
        missing = self._ranks_without_tile_model()
        if missing:
            notes.append(
                f"load spread not charged: the tables of ranks {missing} record no tile model; "
                "the experts are answered for balanced loads at each rank's (N, A, M) "
                "(give tile_cost_us a number to charge one)"
            )
            return None
        notes.append(
            "load spread charged by default (tile_cost_us='auto': each rank's table's model for "
            "the step's per-expert counts); tile_cost_us='none' answers for balanced loads"
        )
        return TABLE_TILE_COST

    def _charge_tiles(
        self,
        routing: BatchRouting,
        components: dict[str, FloatArray],
        cost_us: float | str,
        mode: str,
        notes: list[str],
    ) -> tuple[int, list[str]] | None:
        """Issue 18: the expert kernel's row tiles beyond the table's balanced ones, charged
        where vLLM's block is at least each rank's ``tile_block_m`` rows (its tile model's
        ``block_m``, else 128).

        Appends the note saying what was charged. Where steps of the batch ran different
        blocks with different costs, returns the note's index and each step's own text (the
        blocks that step ran), so that a step's answer names only its own charges."""
        table = cost_us == TABLE_TILE_COST
        if table:
            missing = self._ranks_without_tile_model()
            if missing:
                raise QueryError(
                    f"tile_cost_us='table': the tables of ranks {missing} record no fitted tile "
                    "cost (bundle format 3's expert_loads.tile_model or format 4's tile_models); "
                    "give a number"
                )
            given: float | None = None
        elif not valid_tile_cost(cost_us):
            raise QueryError(
                f"tile_cost_us must be a finite number >= 0 (at most {MAX_TILE_COST_US:,.0f} us) "
                f"or one of {list(TILE_COST_WORDS)}, got {cost_us!r}"
            )
        else:
            given = float(cost_us)
        if routing.expert_counts is None:
            raise QueryError(
                f"tile_cost_us needs per-expert counts: the {routing.policy} policy gives none; "
                "use histogram, round_robin, random or captured"
            )
        if EXPERTS not in components:
            return None
        times = components[EXPERTS]
        ranges = self.deployment.expert_ranges()
        charged: set[tuple[int, float, str]] = set()
        by_step: list[set[tuple[int, float, str]]] = [set() for _ in range(times.shape[0])]
        for rank, tables in enumerate(self.ranks):
            shape = tables.tile_shape()
            start, stop = ranges[rank]
            n = routing.tokens
            a = routing.activated_experts[:, rank]
            m = routing.local_assignments[:, rank]
            blocks = np.array([shape.config(int(x)).block_m for x in n.tolist()])
            # The cost per step: the rank's table's charge at the block vLLM picks at that N
            # (a given number where the block is at least tile_block_m; 'table': the table's
            # own cost for that block, nothing where it records none).
            # Format 5: a block may be charged per weighted wave of the kernel's grid instead
            # (`DeploymentTables.charge_at`, the one place the charge is chosen).
            per_block = {int(b): tables.charge_at(int(b), given) for b in set(blocks.tolist())}
            finite = np.isfinite(times[:, rank]) & (a > 0)
            for b, charge in sorted(per_block.items()):
                if charge is None:
                    continue
                pick = np.flatnonzero((blocks == b) & finite)
                if pick.size == 0:
                    continue
                charged.add((b, charge.cost_us, charge.kind))
                for i in pick.tolist():
                    by_step[i].add((b, charge.cost_us, charge.kind))
                reference = tables.balanced_units_batch(charge, n[pick], a[pick], m[pick], mode)
                counts = routing.expert_counts[pick, start:stop]
                run = tables.charged_units(charge, n[pick], (-(-counts // b)).sum(axis=1))
                ok = reference.code == OK
                times[pick[ok], rank] += charge.cost_us * (run[ok] - reference.time_us[ok])
        source = " (each rank's table's fitted cost)" if table else ""
        least = ", ".join(sorted({str(t.tile_block_m) for t in self.ranks}))
        if given is not None or not any(_per_block(t) for t in self.ranks):
            # One cost per rank for every block of at least its tile_block_m (format 3)
            costs = {given} if given is not None else {t.fitted_tile_cost_us for t in self.ranks}
            each = ", ".join(sorted(f"{c:g}" for c in costs if c is not None))
            what = f"at {each} us each{source} where vLLM's block is at least {least} rows"
            notes.append(_charge_note(what))
            return None
        notes.append(_charge_note(_per_block_charges(charged, source)))
        distinct = {frozenset(c) for c in by_step}
        if len(distinct) < 2:
            return None
        texts = {c: _charge_note(_per_block_charges(set(c), source)) for c in distinct}
        return len(notes) - 1, [texts[frozenset(c)] for c in by_step]

    def _lookup(
        self,
        tables: DeploymentTables,
        rank: int,
        component: str,
        mode: str,
        routing: BatchRouting,
        rows: npt.NDArray[np.intp] | None,
        times: FloatArray,
        code: npt.NDArray[np.int8],
        errors: dict[int, str],
    ) -> None:
        """One component of one rank for the steps ``rows`` (all when None), in ``mode``."""
        steps = times.shape[0] if rows is None else rows.shape[0]
        if steps == 0:
            return
        if steps <= _FEW:
            # A few steps read the scalar path: its bounded cache makes repeated steps
            # cheap, and it answers exactly as the batch does.
            picked = range(times.shape[0]) if rows is None else rows.tolist()
            self._few(tables, rank, component, mode, routing, picked, times, code, errors)
            return
        pick = slice(None) if rows is None else rows
        if component == EXPERTS:
            result = tables.batch(
                EXPERTS,
                routing.tokens[pick],
                routing.activated_experts[pick, rank],
                routing.local_assignments[pick, rank],
                mode=mode,
            )
        else:
            result = tables.batch(component, routing.local_rows[pick, rank], mode=mode)
        times[pick, rank] = result.time_us
        index = np.arange(times.shape[0]) if rows is None else rows
        for j in np.flatnonzero(result.code != OK).tolist():
            i = int(index[j])
            if i in errors:
                continue
            code[i] = result.code[j]
            errors[i] = self._refusal(tables, rank, component, mode, routing, i)

    def _few(
        self,
        tables: DeploymentTables,
        rank: int,
        component: str,
        mode: str,
        routing: BatchRouting,
        picked: Any,
        times: FloatArray,
        code: npt.NDArray[np.int8],
        errors: dict[int, str],
    ) -> None:
        for i in picked:
            try:
                if component == EXPERTS:
                    times[i, rank] = tables.time_us(
                        EXPERTS,
                        int(routing.tokens[i]),
                        int(routing.activated_experts[i, rank]),
                        int(routing.local_assignments[i, rank]),
                        mode,
                    )
                else:
                    times[i, rank] = tables.time_us(
                        component, int(routing.local_rows[i, rank]), -1, -1, mode
                    )
            except (CoverageError, QueryError) as exc:
                times[i, rank] = np.nan
                if i not in errors:
                    code[i] = OUT_OF_SUPPORT if isinstance(exc, CoverageError) else INVALID
                    rows = (
                        f"N={int(routing.tokens[i])} A={int(routing.activated_experts[i, rank])} "
                        f"M={int(routing.local_assignments[i, rank])}"
                        if component == EXPERTS
                        else f"rows={int(routing.local_rows[i, rank])}"
                    )
                    errors[i] = f"step {i}: rank {rank} {component} at {rows}: {exc}"

    def _refusal(
        self,
        tables: DeploymentTables,
        rank: int,
        component: str,
        mode: str,
        routing: BatchRouting,
        i: int,
    ) -> str:
        """A refused lookup worded by the scalar path, naming the rank and component."""
        if component == EXPERTS:
            query = {
                "component": EXPERTS,
                "mode": mode,
                "tokens": int(routing.tokens[i]),
                "activated_experts": int(routing.activated_experts[i, rank]),
                "local_assignments": int(routing.local_assignments[i, rank]),
            }
            coords = (
                f"N={query['tokens']} A={query['activated_experts']} M={query['local_assignments']}"
            )
        else:
            query = {
                "component": component,
                "mode": mode,
                "tokens": int(routing.local_rows[i, rank]),
            }
            coords = f"rows={query['tokens']}"
        answer = tables.answer([query])[0]
        message = answer.get("message", "outside measured support")
        return f"step {i}: rank {rank} {component} at {coords}: {message}"

    def _time(
        self,
        routing: BatchRouting,
        components: dict[str, FloatArray],
        code: npt.NDArray[np.int8],
        errors: dict[int, str],
        cluster: Cluster | None,
        policy: str,
        mode: str,
        table_mode: str,
        given: Any,
        notes: tuple[str, ...],
        graph: npt.NDArray[np.bool_] | None,
        per_step: tuple[int, list[str]] | None = None,
    ) -> BatchEstimate:
        """Walk the trace over every step at once: clocks per rank, collectives synchronise.
        ``per_step``: a note's index in ``notes`` and its text for each step (see
        `_charge_tiles`)."""
        steps, ep = routing.local_rows.shape
        clock = np.zeros((steps, ep))
        compute = np.zeros((steps, ep))
        wait = np.zeros((steps, ep))
        transfer = np.zeros((steps, ep)) if cluster is not None else None
        kept: list[StepArrays] = []
        runs = launch_runs(self.trace.steps)
        # Transfers of every member of a launch, computed at its first member (R44: one NCCL
        # kernel for collectives launched together; each member keeps its own name and bytes).
        launched: dict[tuple[int, tuple[int, ...]], FloatArray] = {}
        for index, tstep in enumerate(self.trace.steps):
            arrive = clock
            if isinstance(tstep, ComputeStep):
                t = components[tstep.component]
                start = clock
                clock = clock + t
                compute += t
                kept.append(StepArrays(arrive, start, clock, []))
                continue
            timings = []
            start_all = clock.copy()
            clock = clock.copy()
            for group in tstep.groups:
                g = list(group)
                size, shares, equal = collective_bytes(tstep, group, routing.local_rows)
                arrivals = clock[:, g]
                begin = arrivals.max(axis=1)
                w = begin[:, None] - arrivals
                wait[:, g] += w
                start_all[:, g] = begin[:, None]
                tr = None
                if cluster is not None:
                    assert transfer is not None
                    run = runs[index]
                    if index == run[0]:
                        members = []
                        for k in run:
                            member = self.trace.steps[k]
                            assert isinstance(member, CollectiveStep)
                            members.append(
                                (member, *collective_bytes(member, group, routing.local_rows))
                            )
                        for k, times in zip(
                            run, launch_transfer_us(cluster, members, group), strict=True
                        ):
                            launched[(k, group)] = times
                    tr = launched.pop((index, group))
                    transfer[:, g] += tr[:, None]
                    end = begin + tr
                else:
                    end = begin
                clock[:, g] = end[:, None]
                timings.append((group, size, shares, equal, begin, tr, w))
            kept.append(StepArrays(arrive, start_all, clock, timings))
        bad = code != OK
        final = clock
        layer_compute = (
            final.max(axis=1)
            if transfer is None
            else _without_transfers(self.trace, components, routing)
        )
        layer = final.max(axis=1) if transfer is not None else None
        if bad.any():
            for arr in (compute, wait, layer_compute):
                arr[bad] = np.nan
            if transfer is not None and layer is not None:
                transfer[bad] = np.nan
                layer[bad] = np.nan
        if cluster is None and any(isinstance(s, CollectiveStep) for s in self.trace.steps):
            notes += (
                "no cluster given: collectives carry their bytes but no transfer time, and "
                "layer_us is null; layer_compute_us leaves transfers out",
            )
        step_notes = None
        if per_step is not None:
            at, texts = per_step
            # One tuple per distinct text, shared by its steps (a batch may hold 10,000).
            shared = {text: (*notes[:at], text, *notes[at + 1 :]) for text in set(texts)}
            step_notes = [shared[text] for text in texts]
        return BatchEstimate(
            trace=self.trace,
            routing=routing,
            policy=policy,
            mode=mode,
            table_mode=table_mode,
            tokens=np.asarray(given, dtype=np.int64),
            components=components,
            compute_us=compute,
            wait_us=wait,
            transfer_us=transfer,
            layer_us=layer,
            layer_compute_us=layer_compute,
            code=code,
            errors=errors,
            cluster=cluster.name if cluster is not None else None,
            notes=notes,
            graph=graph,
            step_notes=step_notes,
            _steps=kept,
        )


def _without_transfers(
    trace: Trace, components: dict[str, FloatArray], routing: BatchRouting
) -> FloatArray:
    """The layer's end with every transfer taken as zero (compute and waits only)."""
    steps, ep = routing.local_rows.shape
    clock = np.zeros((steps, ep))
    for tstep in trace.steps:
        if isinstance(tstep, ComputeStep):
            clock = clock + components[tstep.component]
            continue
        for group in tstep.groups:
            g = list(group)
            clock[:, g] = clock[:, g].max(axis=1)[:, None]
    ends: FloatArray = clock.max(axis=1)
    return ends


def estimator_for(
    tables: ComponentTables, tp: int, dp: int, sequence_parallel: bool = False
) -> LayerEstimator:
    """A cached `LayerEstimator` per (TP, DP, SP) of a ComponentTables."""
    for name, value in (("tp", tp), ("dp", dp)):
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
            raise QueryError(f"{name} must be a positive integer, got {value!r}")
        if value < 1:
            raise QueryError(f"{name} must be a positive integer, got {value}")
    if not isinstance(sequence_parallel, (bool, np.bool_)):
        raise QueryError(f"sequence_parallel must be true or false, got {sequence_parallel!r}")
    tp, dp = int(tp), int(dp)
    cache: dict[tuple[int, int, bool], LayerEstimator] = tables.__dict__.setdefault(
        "_estimators", {}
    )
    key = (tp, dp, bool(sequence_parallel))
    found = cache.get(key)
    if found is None:
        found = cache[key] = LayerEstimator(tables, tp, dp, sequence_parallel)
    return found


def _charge_note(what: str) -> str:
    return (
        f"expert-kernel row tiles beyond the table's balanced tiles are charged {what} (issue 18)"
    )


def _per_block_charges(charged: set[tuple[int, float, str]], source: str) -> str:
    """What a per-block charge cost, block by block (largest first), for the steps named."""
    return (
        "at "
        + ", ".join(
            f"{c:g} us where vLLM's block is {b} rows"
            if k == "tiles"
            else f"{c:g} us per weighted wave of the kernel's grid beyond the balanced "
            f"histogram's where vLLM's block is {b} rows"
            for b, c, k in sorted(charged, reverse=True)
        )
        if charged
        else "at nothing (no step ran a block with a recorded cost)"
    ) + source


def _per_block(tables: DeploymentTables) -> bool:
    """Whether a rank's table charges blocks below its tile_block_m (format 4's per-block
    costs): then the estimate's note names the cost of each block it charged."""
    return any(
        tables.charge_at(b, None) is not None for b in (16, 32, 64) if b < tables.tile_block_m
    )
