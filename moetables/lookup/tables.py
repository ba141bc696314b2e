"""ComponentTables: a bundle opened once, deployments selected and cached for the process."""

from __future__ import annotations

import functools
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from moetables.bundle import EXPERTS, Bundle, TableEntry, load_table, open_bundle
from moetables.errors import CoverageError, QueryError
from moetables.geometry import MoeTarget
from moetables.lookup.balanced import BalancedExpertSurface
from moetables.lookup.codes import CODE_NAMES, INVALID, OK, OUT_OF_SUPPORT
from moetables.lookup.curves import LocalCurve
from moetables.lookup.surface import Coordinates, ExpertSurface

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


@dataclass(frozen=True, slots=True)
class BatchResult:
    time_us: npt.NDArray[np.float64]  # NaN where refused
    code: npt.NDArray[np.int8]  # OK, OUT_OF_SUPPORT, INVALID


class DeploymentTables:
    """The loaded, validated table of one deployment rank with its curves and surfaces."""

    def __init__(self, root: Path, entry: TableEntry, *, coordinates: Coordinates = "raw") -> None:
        self.entry = entry
        self.target = entry.target
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
        # A bounded cache keyed by every coordinate (R40); errors are not cached.
        self.time_us = functools.lru_cache(maxsize=SCALAR_CACHE_SIZE)(self._time_us)

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
        self._known(component, mode)
        if component == EXPERTS:
            return self._experts[(component, mode)].time(
                tokens, activated_experts, local_assignments
            )
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

        Queries are grouped by component and mode and answered in batches; refused rows are
        asked again one by one only to word their message.
        """
        answers: list[dict[str, Any] | None] = [None] * len(queries)
        # Per (component, mode): row indices and the three coordinate columns.
        groups: dict[tuple[str, str], tuple[list[int], list[int], list[int], list[int]]] = {}
        known = {(c, m) for c in self.components for m in self.modes}
        for i, raw in enumerate(queries):
            # Fast path for the common well-formed dict; anything else is parsed strictly.
            if type(raw) is dict:
                key = (raw.get("component"), raw.get("mode", "eager"))
                n = raw.get("tokens")
                a = raw.get("activated_experts", -1)
                m = raw.get("local_assignments", -1)
                if (
                    key in known
                    and type(n) is int
                    and type(a) is int
                    and type(m) is int
                    and (
                        key[0] != EXPERTS
                        or ("activated_experts" in raw and "local_assignments" in raw)
                    )
                ):
                    group = groups.get(key)  # type: ignore[arg-type]
                    if group is None:
                        group = groups[key] = ([], [], [], [])  # type: ignore[index]
                    group[0].append(i)
                    group[1].append(n)
                    group[2].append(a)
                    group[3].append(m)
                    continue
            try:
                query = parse_query(raw)
                self._known(query.component, query.mode)
            except QueryError as exc:
                answers[i] = {"error": "invalid", "message": str(exc)}
                continue
            group = groups.setdefault((query.component, query.mode), ([], [], [], []))
            group[0].append(i)
            group[1].append(query.tokens)
            group[2].append(query.activated_experts)
            group[3].append(query.local_assignments)
        for (component, mode), (rows, n_col, a_col, m_col) in groups.items():
            result = (
                self.batch(component, n_col, a_col, m_col, mode=mode)
                if component == EXPERTS
                else self.batch(component, n_col, mode=mode)
            )
            for j, (value, code) in enumerate(
                zip(result.time_us.tolist(), result.code.tolist(), strict=True)
            ):
                if code == OK:
                    answers[rows[j]] = {"time_us": value}
                else:
                    query = Query(component, mode, n_col[j], a_col[j], m_col[j])
                    answers[rows[j]] = self._refusal(query, code)
        return [
            a if a is not None else {"error": "invalid", "message": "unanswered"} for a in answers
        ]

    def _refusal(self, query: Query, code: int) -> dict[str, Any]:
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
            self._loaded[key] = tables
            return tables


# Re-exported for callers that switch on batch codes.
__all__ += ["INVALID", "OK", "OUT_OF_SUPPORT"]
