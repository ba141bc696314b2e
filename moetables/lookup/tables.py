"""ComponentTables: a bundle opened once, deployments selected and cached for the process."""

from __future__ import annotations

import functools
import math
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from moetables.bundle import EXPERTS, Bundle, TableEntry, load_table, open_bundle
from moetables.errors import CoverageError, QueryError
from moetables.geometry import MoeTarget
from moetables.lookup.balanced import BalancedExpertSurface
from moetables.lookup.codes import CODE_NAMES, INVALID, OK, OUT_OF_SUPPORT
from moetables.lookup.curves import LocalCurve
from moetables.lookup.surface import Coordinates, ExpertSurface

if TYPE_CHECKING:
    from moetables.comm import Cluster
    from moetables.estimate import BatchEstimate, LayerEstimate

__all__ = ["BatchResult", "ComponentTables", "DeploymentTables", "Query", "parse_query"]

SCALAR_CACHE_SIZE = 65536


@dataclass(frozen=True, slots=True)
class Query:
    component: str
    mode: str
    tokens: int
    activated_experts: int
    local_assignments: int


def _int(raw: Mapping[str, Any], key: str, default: int | None = None) -> int:
    value = raw.get(key, default)
    if value is None:
        raise QueryError(f"{key} is required")
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise QueryError(f"{key} must be an integer, got {value!r}")
    return value


def parse_query(raw: Any) -> Query:
    """A query as the CLI and REST API accept it: one JSON object."""
    if not isinstance(raw, Mapping):
        raise QueryError("a query must be a JSON object")
    component = raw.get("component")
    mode = raw.get("mode", "eager")
    if not isinstance(component, str) or not isinstance(mode, str):
        raise QueryError("component and mode must be strings")
    tokens = _int(raw, "tokens")
    if component == EXPERTS:
        return Query(
            component, mode, tokens, _int(raw, "activated_experts"), _int(raw, "local_assignments")
        )
    return Query(
        component,
        mode,
        tokens,
        _int(raw, "activated_experts", -1),
        _int(raw, "local_assignments", -1),
    )


_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


def _lookup(table: Mapping[Any, int], keys: list[Any]) -> list[int]:
    """``table.get(key, -1)`` for each key; unhashable keys (a JSON list or object) get -1."""
    try:
        return [table.get(k, -1) for k in keys]
    except TypeError:
        found = []
        for k in keys:
            try:
                found.append(table.get(k, -1))
            except TypeError:
                found.append(-1)
        return found


def _int64(column: list[Any]) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.bool_]]:
    """The column as int64, and where it held a plain int that fits (-1 elsewhere)."""
    if set(map(type, column)) == {int}:
        try:
            return np.array(column, dtype=np.int64), np.ones(len(column), dtype=bool)
        except OverflowError:
            pass
    fits = [type(v) is int and _INT64_MIN <= v <= _INT64_MAX for v in column]
    values = [v if ok else -1 for v, ok in zip(column, fits, strict=True)]
    return np.array(values, dtype=np.int64), np.array(fits, dtype=bool)


# Batches this small are read query by query: array set-up would cost more than the reading.
_FEW = 16


def _read_few(
    queries: Sequence[Any], groups: Mapping[tuple[str, str], int]
) -> tuple[list[Any], list[int]]:
    """``read_columns`` for a few queries, one at a time, by the same rule (lists, not arrays)."""
    columns: list[tuple[list[int], list[int], list[int], list[int]] | None] = [None] * len(groups)
    rest: list[int] = []
    for i, q in enumerate(queries):
        g = -1
        if type(q) is dict:
            component, mode = q.get("component"), q.get("mode", "eager")
            n = q.get("tokens")
            a = q.get("activated_experts", -1)
            m = q.get("local_assignments", -1)
            if type(component) is str and type(mode) is str:
                g = groups.get((component, mode), -1)
            if (
                g >= 0
                and type(n) is int
                and type(a) is int
                and type(m) is int
                and all(_INT64_MIN <= v <= _INT64_MAX for v in (n, a, m))
                and (component != EXPERTS or ("activated_experts" in q and "local_assignments" in q))
            ):
                found = columns[g]
                if found is None:
                    found = columns[g] = ([], [], [], [])
                for column, value in zip(found, (i, n, a, m), strict=True):
                    column.append(value)
                continue
        rest.append(i)
    return list(columns), rest


def read_columns(
    queries: Sequence[Any], groups: Mapping[tuple[str, str], int]
) -> tuple[list[Any], list[int]]:
    """Well-formed queries of known (component, mode) ``groups``, read column by column.

    Well formed here: a dict of a known component and mode with plain int coordinates that
    fit int64, and both expert coordinates given for experts; ``parse_query`` reads exactly
    these without converting anything. Returns, per group in ``groups`` order, (rows,
    tokens, activated_experts, local_assignments) in query order (lists for a few queries,
    int64 arrays otherwise), or None; and the rows left for ``parse_query``.
    """
    count = len(queries)
    if count == 0:
        return [None] * len(groups), []
    if count <= _FEW:
        return _read_few(queries, groups)
    if set(map(type, queries)) == {dict}:
        rows = np.arange(count)
        objects = list(queries)
    else:
        rows = np.array([i for i, q in enumerate(queries) if type(q) is dict], dtype=np.int64)
        objects = [queries[i] for i in rows.tolist()]
    components = [q.get("component") for q in objects]
    modes = [q.get("mode", "eager") for q in objects]
    try:
        one_mode = len(set(modes)) <= 1
    except TypeError:  # an unhashable mode
        one_mode = False
    if one_mode:
        mode = modes[0] if modes else "eager"
        of_mode = {c: g for (c, m), g in groups.items() if m == mode}
        group = np.array(_lookup(of_mode, components), dtype=np.int64)
    else:
        keys = [(c, m) if type(c) is str and type(m) is str else None
                for c, m in zip(components, modes, strict=True)]
        group = np.array(_lookup(groups, keys), dtype=np.int64)
    n_col, good = _int64([q.get("tokens") for q in objects])
    # An absent expert coordinate reads as -1, as it does for a local component.
    a_col, a_ok = _int64([q.get("activated_experts", -1) for q in objects])
    m_col, m_ok = _int64([q.get("local_assignments", -1) for q in objects])
    good &= (group >= 0) & a_ok & m_ok
    expert = np.isin(group, [g for (c, _), g in groups.items() if c == EXPERTS])
    for i in np.flatnonzero(good & expert & ((a_col == -1) | (m_col == -1))).tolist():
        good[i] = "activated_experts" in objects[i] and "local_assignments" in objects[i]
    if len(rows) == count:
        taken = rows[~good].tolist()
    else:  # with the rows that are not dicts
        taken = sorted(set(range(count)) - set(rows[good].tolist()))
    parts: list[tuple[npt.NDArray[np.int64], ...] | None] = []
    picked = np.where(good, group, -1)
    for g in range(len(groups)):
        pick = np.flatnonzero(picked == g)
        parts.append((rows[pick], n_col[pick], a_col[pick], m_col[pick]) if pick.size else None)
    return parts, taken


@dataclass(frozen=True, slots=True)
class BatchResult:
    time_us: npt.NDArray[np.float64]  # NaN where refused
    code: npt.NDArray[np.int8]  # OK, OUT_OF_SUPPORT, INVALID


class DeploymentTables:
    """The loaded, validated table of one deployment rank with its curves and surfaces."""

    def __init__(self, root: Path, entry: TableEntry, *, coordinates: Coordinates = "raw") -> None:
        self.entry = entry
        self.target = entry.target
        self._coordinates: Coordinates = coordinates
        table = load_table(root, entry)
        where = f"{entry.target.deployment} tp{entry.target.tp}"
        self._local: dict[tuple[str, str], LocalCurve] = {}
        self._experts: dict[tuple[str, str], ExpertSurface | BalancedExpertSurface] = {}
        for component in entry.components:
            for mode in entry.modes:
                rows = table.select(component, mode)
                label = f"{component}/{mode} [{where}]"
                if component != EXPERTS:
                    self._local[(component, mode)] = LocalCurve(
                        table.tokens[rows], table.time_us[rows], label
                    )
                elif entry.layout == "historical":
                    self._experts[(component, mode)] = BalancedExpertSurface(
                        table.tokens[rows],
                        table.activated_experts[rows],
                        table.local_assignments[rows],
                        table.time_us[rows],
                        entry.geometry,
                        label=label,
                    )
                else:
                    self._experts[(component, mode)] = ExpertSurface(
                        table.tokens[rows],
                        table.activated_experts[rows],
                        table.local_assignments[rows],
                        table.time_us[rows],
                        entry.geometry,
                        label=label,
                        coordinates=coordinates,
                    )
        self.components = entry.components
        self.modes = entry.modes
        self.root = root
        # The bundle this rank came from: a layer estimate needs its sibling ranks.
        self.owner: ComponentTables | None = None
        # A bounded cache keyed by every coordinate (R40); errors are not cached.
        self.time_us = functools.lru_cache(maxsize=SCALAR_CACHE_SIZE)(self._time_us)

    def estimate(
        self,
        tokens_per_rank: Sequence[int],
        policy: str = "balanced",
        cluster: Cluster | None = None,
        mode: str = "eager",
        **options: Any,
    ) -> LayerEstimate:
        """The MoE layer estimate of this rank's deployment (every rank of its TP/DP/SP) for
        one step's padded per-DP-rank token counts; see `moetables.estimate`."""
        owner = self.owner
        if owner is None:
            owner = self.owner = ComponentTables(self.root, coordinates=self._coordinates)
        t = self.target
        return owner.estimate(
            tokens_per_rank, tp=t.tp, dp=t.dp, sequence_parallel=t.sequence_parallel,
            policy=policy, cluster=cluster, mode=mode, **options,
        )

    def estimate_batch(
        self,
        tokens_per_rank: Any,
        policy: str = "balanced",
        cluster: Cluster | None = None,
        mode: str = "eager",
        **options: Any,
    ) -> BatchEstimate:
        """`estimate` for many steps at once: arrays per step (see `BatchEstimate`)."""
        owner = self.owner
        if owner is None:
            owner = self.owner = ComponentTables(self.root, coordinates=self._coordinates)
        t = self.target
        return owner.estimate_batch(
            tokens_per_rank, tp=t.tp, dp=t.dp, sequence_parallel=t.sequence_parallel,
            policy=policy, cluster=cluster, mode=mode, **options,
        )

    def _known(self, component: str, mode: str) -> None:
        if component not in self.components:
            raise QueryError(
                f"unknown component {component!r}; this table has {list(self.components)}"
            )
        if mode not in self.modes:
            raise QueryError(
                f"mode {mode!r} is not measured here; this table has {list(self.modes)}"
            )

    def _time_us(
        self,
        component: str,
        tokens: int,
        activated_experts: int = -1,
        local_assignments: int = -1,
        mode: str = "eager",
    ) -> float:
        """Microseconds for one query; QueryError if malformed, CoverageError if unmeasured."""
        try:
            surface = self._experts.get((component, mode))
        except TypeError:  # unhashable, so unknown: _known words the error
            surface = None
        if surface is not None:  # the hot path: a known component and mode, experts
            return surface.time(tokens, activated_experts, local_assignments)
        self._known(component, mode)
        if activated_experts != -1 or local_assignments != -1:
            raise QueryError(f"{component} is a local component: give no expert coordinates")
        if tokens < 1:
            raise QueryError(f"tokens must be at least 1, got {tokens}")
        return self._local[(component, mode)].time(tokens)

    def batch(
        self,
        component: str,
        tokens: npt.ArrayLike,
        activated_experts: npt.ArrayLike | None = None,
        local_assignments: npt.ArrayLike | None = None,
        mode: str = "eager",
    ) -> BatchResult:
        """Vectorised lookups of one component and mode; refusals are per-row codes."""
        self._known(component, mode)
        n = np.asarray(tokens, dtype=np.int64)
        if component == EXPERTS:
            if activated_experts is None or local_assignments is None:
                raise QueryError("experts need activated_experts and local_assignments")
            a = np.asarray(activated_experts, dtype=np.int64)
            m = np.asarray(local_assignments, dtype=np.int64)
            if a.shape != n.shape or m.shape != n.shape:
                raise QueryError("tokens, activated_experts and local_assignments differ in length")
            values, codes = self._experts[(component, mode)].batch(n, a, m)
        else:
            values, codes = self._local[(component, mode)].batch(n)
        return BatchResult(time_us=values, code=codes)

    def answer(self, queries: Sequence[Any]) -> list[dict[str, Any]]:
        """One answer per query, in order: ``{"time_us": x}`` or ``{"error": ..., "message": ...}``.

        Well-formed queries are read column by column and grouped by component and mode;
        anything else is parsed strictly, one by one. Each group is answered in one batch,
        and refused rows are asked again one by one only to word their message.
        """
        answers: list[dict[str, Any] | None] = [None] * len(queries)
        known = self._group_index()
        parts, rest = read_columns(queries, known)
        groups: dict[tuple[str, str], list[tuple[Any, Any, Any, Any]]] = {}
        for key, part in zip(known, parts, strict=True):
            if part is not None:
                groups[key] = [part]
        strict: dict[tuple[str, str], tuple[list[int], list[int], list[int], list[int]]] = {}
        wording: dict[int, Query] = {}  # rows whose refusal names coordinates no batch holds
        for i in rest:
            try:
                query = parse_query(queries[i])
                self._known(query.component, query.mode)
            except QueryError as exc:
                answers[i] = {"error": "invalid", "message": str(exc)}
                continue
            coordinates = (query.tokens, query.activated_experts, query.local_assignments)
            if not all(_INT64_MIN <= v <= _INT64_MAX for v in coordinates):
                if query.component == EXPERTS or not _INT64_MIN <= query.tokens <= _INT64_MAX:
                    answers[i] = self._one(query)  # beyond what a batch can hold
                    continue
                # A local batch never reads the expert coordinates; a refusal still words them.
                coordinates = (query.tokens, -1, -1)
                wording[i] = query
            group = strict.setdefault((query.component, query.mode), ([], [], [], []))
            for column, value in zip(group, (i, *coordinates), strict=True):
                column.append(value)
        for key, columns in strict.items():
            if len(columns[0]) > _FEW:
                rows_, n_, a_, m_ = (np.array(c, dtype=np.int64) for c in columns)
                groups.setdefault(key, []).append((rows_, n_, a_, m_))
            else:
                groups.setdefault(key, []).append(columns)
        for (component, mode), found in groups.items():
            if len(found) == 1:
                rows, n_col, a_col, m_col = found[0]
            else:  # in query order, as one batch
                rows, n_col, a_col, m_col = (np.concatenate(c) for c in zip(*found, strict=True))
                order = np.argsort(rows, kind="stable")
                rows, n_col, a_col, m_col = rows[order], n_col[order], a_col[order], m_col[order]
            values, codes = self._group(component, mode, n_col, a_col, m_col)
            if isinstance(codes, list):  # a few rows, in plain Python
                for i, n, a, m, value, code in zip(
                    rows, n_col, a_col, m_col, values, codes, strict=True
                ):
                    answers[i] = {"time_us": value} if code == OK else self._refusal(
                        wording.get(i) or Query(component, mode, n, a, m), code
                    )
                continue
            good = codes == OK
            answered = zip(rows.tolist(), values.tolist(), strict=True) if good.all() else zip(
                rows[good].tolist(), values[good].tolist(), strict=True
            )
            for i, value in answered:
                answers[i] = {"time_us": value}
            for j in np.flatnonzero(~good).tolist():
                i = int(rows[j])
                query = wording.get(i) or Query(
                    component, mode, int(n_col[j]), int(a_col[j]), int(m_col[j])
                )
                answers[i] = self._refusal(query, int(codes[j]))
        return [
            a if a is not None else {"error": "invalid", "message": "unanswered"} for a in answers
        ]

    def _group_index(self) -> dict[tuple[str, str], int]:
        """Each measured (component, mode), numbered (built once)."""
        index: dict[tuple[str, str], int] | None = self.__dict__.get("_groups")
        if index is None:
            pairs = [(c, m) for c in self.components for m in self.modes]
            index = self.__dict__["_groups"] = {key: g for g, key in enumerate(pairs)}
        return index

    def _group(
        self,
        component: str,
        mode: str,
        tokens: Any,
        activated_experts: Any,
        local_assignments: Any,
    ) -> tuple[Any, Any]:
        """Times and codes of one group of queries, as ``batch`` gives them: arrays, or lists
        for a few rows (given as lists).

        A few rows of a local component go through its curve's scalar path, which answers
        exactly as its batch does and costs less than setting up the arrays.
        """
        few = isinstance(tokens, list)
        if few and component != EXPERTS:
            curve = self._local[(component, mode)]
            values: list[float] = []
            codes: list[int] = []
            for n in tokens:
                try:
                    values.append(curve.time(n) if n >= 1 else math.nan)
                    codes.append(OK if n >= 1 else INVALID)
                except CoverageError:
                    values.append(math.nan)
                    codes.append(OUT_OF_SUPPORT)
            return values, codes
        result = (
            self.batch(component, tokens, activated_experts, local_assignments, mode=mode)
            if component == EXPERTS
            else self.batch(component, tokens, mode=mode)
        )
        if few:
            return result.time_us.tolist(), result.code.tolist()
        return result.time_us, result.code

    def _one(self, query: Query) -> dict[str, Any]:
        """A query answered by the scalar path alone."""
        try:
            return {"time_us": self._time_us(
                query.component, query.tokens, query.activated_experts,
                query.local_assignments, query.mode,
            )}
        except QueryError as exc:
            return {"error": "invalid", "message": str(exc)}
        except CoverageError as exc:
            return {"error": "out_of_support", "message": str(exc)}

    def _refusal(self, query: Query, code: int) -> dict[str, Any]:
        surface = self._experts.get((query.component, query.mode))
        if (
            code == OUT_OF_SUPPORT
            and type(surface) is ExpertSurface
            and (query.activated_experts, query.local_assignments) != (0, 0)
        ):
            # Batch and scalar locate alike (bit for bit), so the batch's refusal stands:
            # word it without walking the triangulation a second time.
            message = surface.outside_message(
                query.tokens, query.activated_experts, query.local_assignments
            )
            return {"error": "out_of_support", "message": message}
        try:
            self._time_us(
                query.component,
                query.tokens,
                query.activated_experts,
                query.local_assignments,
                query.mode,
            )
        except QueryError as exc:
            return {"error": "invalid", "message": str(exc)}
        except CoverageError as exc:
            return {"error": "out_of_support", "message": str(exc)}
        # The batch and scalar paths disagree only at the hull's rounding edge; keep the refusal.
        return {"error": CODE_NAMES.get(code, "invalid"), "message": "outside measured support"}


class ComponentTables:
    """A bundle opened for lookups. Deployments load once and stay cached with the process,
    as do deployments the bundle does not cover; a corrupt table raises every time (R43).
    """

    def __init__(self, bundle: str | Path | Bundle, *, coordinates: Coordinates = "raw") -> None:
        self.bundle = bundle if isinstance(bundle, Bundle) else open_bundle(bundle)
        self.coordinates: Coordinates = coordinates
        self._loaded: dict[tuple[int, int, int, bool], DeploymentTables] = {}
        self._absent: dict[tuple[int, int, int, bool], str] = {}
        self._lock = threading.Lock()

    def deployment(
        self, tp: int, dp: int, rank: int, sequence_parallel: bool = False
    ) -> DeploymentTables:
        key = (tp, dp, rank, sequence_parallel)
        found = self._loaded.get(key)
        if found is not None:
            return found
        if key in self._absent:
            raise CoverageError(self._absent[key])
        try:
            target = MoeTarget.for_rank(tp, dp, rank, sequence_parallel)
        except ValueError as exc:
            raise QueryError(str(exc)) from None
        with self._lock:
            found = self._loaded.get(key)
            if found is not None:
                return found
            entry = self.bundle.entry_for(target)
            if entry is None:
                have = ", ".join(
                    f"tp{e.target.tp}/{e.target.deployment}" for e in self.bundle.entries
                )
                message = (
                    f"no table for TP{tp}/DP{dp}/EP{tp * dp} rank {rank} "
                    f"sequence_parallel={sequence_parallel}; this bundle covers: {have}"
                )
                self._absent[key] = message
                raise CoverageError(message)
            tables = DeploymentTables(self.bundle.root, entry, coordinates=self.coordinates)
            tables.owner = self
            self._loaded[key] = tables
            return tables

    def estimate(
        self,
        tokens_per_rank: Sequence[int],
        *,
        tp: int,
        dp: int,
        sequence_parallel: bool = False,
        policy: str = "balanced",
        cluster: Cluster | None = None,
        mode: str = "eager",
        **options: Any,
    ) -> LayerEstimate:
        """One MoE layer in one step of the TP/DP(/SP) deployment: per rank rows, N, A, M,
        component times, compute, wait and transfer; the collectives; the layer time.

        ``options``: ``expert_counts`` (histogram), ``active_curve`` and ``load_shares``
        (custom), ``seed`` (random, captured), ``capture_sizes`` (graph mode), ``profile``, ``layer``
        and ``captured_expectation`` (captured: a `moetables.profiles.RoutingProfile`).
        """
        from moetables.estimate import estimator_for

        return estimator_for(self, tp, dp, sequence_parallel).estimate(
            tokens_per_rank, policy=policy, cluster=cluster, mode=mode, **options
        )

    def estimate_batch(
        self,
        tokens_per_rank: Any,
        *,
        tp: int,
        dp: int,
        sequence_parallel: bool = False,
        policy: str = "balanced",
        cluster: Cluster | None = None,
        mode: str = "eager",
        **options: Any,
    ) -> BatchEstimate:
        """`estimate` for many steps: ``tokens_per_rank`` of shape (steps, dp)."""
        from moetables.estimate import estimator_for

        return estimator_for(self, tp, dp, sequence_parallel).estimate_batch(
            tokens_per_rank, policy=policy, cluster=cluster, mode=mode, **options
        )


# Re-exported for callers that switch on batch codes.
__all__ += ["INVALID", "OK", "OUT_OF_SUPPORT"]
