"""Kernel-step tables: one triangulation per segment of vLLM's Triton expert kernel in N.

vLLM runs one Triton configuration (and sorted or naive pair assignment) per call, picked from
the rows N (`moetables.triton_config.KernelSwitches`). The expert time is a staircase in N at
every switch of that kernel, so an answer interpolated across a switch mixes two kernels
(docs/benchmarks.md, "The kernel-step tables, measured": up to 31 % off the own-segment
answer). A table whose contract records ``expert_sampling.kernel_steps`` was planned with both
sides t, t + 1 of every switch measured; this module splits its points at exactly those
switches, computed by the same function the planner used, triangulates each segment on its own
(`ExpertSurface`, R40) and answers a query from its own segment only.

Support (R40, no extrapolation): a segment's own hull. A query inside the table's hull but
outside its segment's hull is refused (``OUT_OF_SUPPORT``, or `CoverageError` naming the
segment), never answered from another kernel. The all-remote curve (A = M = 0: no local pair,
so no kernel tile) stays one curve over the whole table, as before.

Only tables with the record are split; every other table keeps the one `ExpertSurface`.
"""

from __future__ import annotations

import bisect
import copy
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from moetables.errors import BundleError, CoverageError, QueryError
from moetables.geometry import ExpertGeometry
from moetables.lookup.codes import OK, OUT_OF_SUPPORT
from moetables.lookup.curves import LocalCurve
from moetables.lookup.surface import Coordinates, ExpertSurface, feasibility_codes
from moetables.triton_config import (
    KERNEL_STEPS_RULES,
    KernelShape,
    KernelSwitches,
    TritonConfig,
    TritonConfigError,
)

__all__ = ["KernelSegment", "SegmentedExpertSurface", "contract_kernel_switches"]

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]


def contract_kernel_switches(
    contract: Mapping[str, Any], geometry: ExpertGeometry, where: str
) -> KernelSwitches | None:
    """The kernel switches a contract's ``expert_sampling.kernel_steps`` record names, or None
    for a table planned without kernel steps (its lookup is unchanged).

    The record's rule must be one this reader knows, and its inputs (device family, local
    experts, expert width, config dtype, block shape, global experts, top-k, expert map) must be
    the table's own geometry's: a record that disagrees is a corrupt contract (R43), refused
    rather than read with a guessed segmentation (`BundleError`).
    """
    sampling = contract.get("expert_sampling")
    record = sampling.get("kernel_steps") if isinstance(sampling, Mapping) else None
    if record is None:
        return None
    if not isinstance(record, Mapping):
        raise BundleError(where, "expert_sampling.kernel_steps is not a mapping")
    rule = record.get("rule")
    # v2, v3 and v4 have the same switches (v3 and v4 add points inside segments only).
    if rule not in KERNEL_STEPS_RULES:
        raise BundleError(
            where,
            f"expert_sampling.kernel_steps.rule {rule!r} is not known to this reader "
            f"(it knows {', '.join(map(repr, KERNEL_STEPS_RULES))}); its kernel segments cannot "
            "be derived",
        )
    # Imported here: moetables.tiles imports the lookup package's modules.
    from moetables.tiles import contract_kernel_shape

    try:
        shape: KernelShape = contract_kernel_shape(contract, geometry.local_experts, where)
    except (ValueError, TritonConfigError) as exc:
        raise BundleError(where, f"expert_sampling.kernel_steps: {exc}") from None
    block = record.get("block_shape")
    recorded = {
        "device": record.get("device"),
        "local_experts": record.get("local_experts"),
        "expert_width": record.get("expert_width"),
        "config_dtype": record.get("config_dtype"),
        "block_shape": tuple(block) if isinstance(block, (list, tuple)) else block,
        "global_experts": record.get("global_experts"),
        "top_k": record.get("top_k"),
        "expert_map": record.get("expert_map"),
    }
    expected = {
        "device": shape.device,
        "local_experts": shape.local_experts,
        "expert_width": shape.width,
        "config_dtype": shape.dtype,
        "block_shape": shape.block_shape,
        "global_experts": geometry.global_experts,
        "top_k": geometry.top_k,
        # vLLM builds an expert map whenever experts are split over EP ranks (as the planner).
        "expert_map": geometry.local_experts < geometry.global_experts,
    }
    wrong = [
        f"{k} {recorded[k]!r} (table: {expected[k]!r})"
        for k in expected
        if recorded[k] != expected[k]
    ]
    if wrong:
        raise BundleError(
            where,
            "expert_sampling.kernel_steps disagrees with the table's geometry: " + ", ".join(wrong),
        )
    return KernelSwitches(
        shape, geometry.global_experts, geometry.top_k, bool(expected["expert_map"])
    )


def describe_kernel(kernel: tuple[TritonConfig, bool]) -> str:
    config, naive = kernel
    return (
        f"BLOCK_SIZE_M={config.block_m} BLOCK_SIZE_N={config.block_n} "
        f"BLOCK_SIZE_K={config.block_k} GROUP_SIZE_M={config.group_m} "
        f"num_warps={config.num_warps} num_stages={config.num_stages}"
        + (", naive assignment" if naive else "")
    )


@dataclass(frozen=True, slots=True)
class KernelSegment:
    """One run of N served by one kernel, and the surface of the points measured on it."""

    first: int  # smallest N of the segment
    last: int | None  # largest N, None for the last segment (open above)
    kernel: str  # the configuration, in words
    surface: ExpertSurface | None  # None: no point measured on this segment
    rows: IntArray  # indices of its points among the table's positive (A, M > 0) points

    @property
    def span(self) -> str:
        return f"N {self.first}..{self.last}" if self.last is not None else f"N >= {self.first}"


class SegmentedExpertSurface:
    """`ExpertSurface`'s interface (``time``, ``batch``, ``outside_message``) over a kernel-step
    table: one surface per kernel segment in N, each query answered by its own segment's."""

    def __init__(
        self,
        tokens: IntArray,
        active: IntArray,
        pairs: IntArray,
        times: FloatArray,
        geometry: ExpertGeometry,
        switches: KernelSwitches,
        *,
        label: str,
        coordinates: Coordinates = "raw",
    ) -> None:
        self.geometry = geometry
        self.label = label
        self.coordinates: Coordinates = coordinates
        self.kernel_switches = switches
        self._local_experts = geometry.local_experts
        self._top_k = geometry.top_k
        self._floor_per_token = max(0, geometry.top_k - geometry.remote_experts)
        remote = (active == 0) & (pairs == 0)
        positive = ~remote
        pn, pa, pm, pt = tokens[positive], active[positive], pairs[positive], times[positive]
        # The all-remote rows run no local pair: one curve over the whole table, as before.
        self.remote: LocalCurve | None = (
            LocalCurve(tokens[remote], times[remote], f"{label} all-remote (A=M=0)")
            if remote.any()
            else None
        )
        self._positive, self._remote_tokens = positive, tokens[remote]  # for `with_values`
        self.support = (int(pn.min()), int(pn.max())) if pn.size else (0, 0)
        top = int(pn.max()) if pn.size else 1
        ends = switches.switches(top)  # segment i is ends[i-1]+1 .. ends[i]
        self._ends = ends
        self._ends_array = np.asarray(ends, dtype=np.int64)
        which = np.searchsorted(self._ends_array, pn, side="left")
        segments: list[KernelSegment] = []
        for i in range(len(ends) + 1):
            first = ends[i - 1] + 1 if i else 1
            last = ends[i] if i < len(ends) else None
            rows = np.flatnonzero(which == i)
            kernel = describe_kernel(switches.kernel(first))
            span = f"N {first}..{last}" if last is not None else f"N >= {first}"
            surface = (
                ExpertSurface(
                    pn[rows],
                    pa[rows],
                    pm[rows],
                    pt[rows],
                    geometry,
                    label=f"{label} kernel segment {span} ({kernel})",
                    coordinates=coordinates,
                )
                if rows.size
                else None
            )
            segments.append(KernelSegment(first, last, kernel, surface, rows))
        self.segments = segments
        # Where a segment answers for the largest number of dimensions (for `explain`).
        self.dimension = max((s.surface.dimension for s in segments if s.surface), default=0)

    def with_values(self, values: FloatArray, *, label: str) -> SegmentedExpertSurface:
        """The same points and segments with other values (one per row, in the rows' order),
        each segment sharing its triangulation (`ExpertSurface.with_values`)."""
        positive = self._positive
        if values.shape != positive.shape:
            raise ValueError(f"{label}: {values.shape[0]} values for {positive.shape[0]} rows")
        other = copy.copy(self)
        other.label = label
        remote = ~positive
        if self.remote is not None:
            other.remote = LocalCurve(
                self._remote_tokens, values[remote], f"{label} all-remote (A=M=0)"
            )
        pt = values[positive]
        other.segments = [
            KernelSegment(
                s.first,
                s.last,
                s.kernel,
                s.surface.with_values(
                    pt[s.rows], label=f"{label} kernel segment {s.span} ({s.kernel})"
                )
                if s.surface is not None
                else None,
                s.rows,
            )
            for s in self.segments
        ]
        return other

    def segment(self, tokens: int) -> KernelSegment:
        """The segment whose kernel vLLM runs for ``tokens`` rows."""
        return self.segments[bisect.bisect_left(self._ends, tokens)]

    # -- one query ----------------------------------------------------------------------

    def time(self, tokens: int, active: int, pairs: int) -> float:
        """One query; QueryError (infeasible) or CoverageError (outside its segment's support)."""
        g = self.geometry
        if active == 0 and pairs == 0:
            if tokens < 1 or not g.all_remote_possible:
                raise QueryError(
                    f"{self.label}: A=M=0 needs N >= 1 and E-L >= k "
                    f"(E={g.global_experts} L={g.local_experts} k={g.top_k})"
                )
            if self.remote is None:
                raise CoverageError(f"{self.label}: this table has no all-remote (A=M=0) rows")
            return self.remote.time(tokens)
        # Infeasible is worded with the table's label, as a one-surface table words it
        # (ExpertGeometry.feasible for A, M not both 0, inlined: this runs once a query). The
        # same lines stand in ExpertSurface.time: sharing them through a method cost 4-5 % of
        # the scalar lookup rate (414-417k against 429-444k queries/s, session 5).
        if not (
            tokens >= 1
            and 1 <= active <= self._local_experts
            and max(active, tokens * self._floor_per_token)
            <= pairs
            <= tokens * min(self._top_k, active)
        ):
            low, high = g.assignment_bounds(tokens, active) if tokens >= 1 else (0, 0)
            raise QueryError(
                f"{self.label}: N={tokens} A={active} M={pairs} is infeasible: "
                f"{g.infeasibility(tokens, active, pairs)} "
                f"(need 1 <= A <= {g.local_experts} and {low} <= M <= {high})"
            )
        segment = self.segments[bisect.bisect_left(self._ends, tokens)]
        surface = segment.surface
        if surface is None:
            raise CoverageError(self.outside_message(tokens, active, pairs))
        try:
            return surface.time(tokens, active, pairs)
        except CoverageError:
            raise CoverageError(self.outside_message(tokens, active, pairs)) from None

    def outside_message(self, tokens: int, active: int, pairs: int) -> str:
        """The refusal of a feasible point (A, M not both 0) that its segment does not hold."""
        segment = self.segment(tokens)
        if segment.surface is None:
            held = "no point is measured on it"
        else:
            lo, hi = segment.surface.support
            held = f"its points span N {lo}..{hi}"
        return (
            f"{self.label}: N={tokens} A={active} M={pairs} is outside the measured support of "
            f"its kernel segment {segment.span} ({segment.kernel}; {held}); a kernel-step "
            f"table answers from the query's own segment only, never across a configuration "
            f"switch, and never extrapolates"
        )

    # -- batch --------------------------------------------------------------------------

    def batch(
        self, tokens: IntArray, active: IntArray, pairs: IntArray
    ) -> tuple[FloatArray, npt.NDArray[np.int8]]:
        """Times (NaN where refused) and per-row codes, each row from its own segment."""
        remote = (active == 0) & (pairs == 0)
        if remote.any():
            # Feasibility and the all-remote curve first, for every row; then the rest by segment.
            values = np.full(tokens.shape[0], np.nan)
            codes = feasibility_codes(self.geometry, tokens, active, pairs)
            rows = np.flatnonzero(remote & (codes == OK))
            if self.remote is None:
                codes[rows] = OUT_OF_SUPPORT
            else:
                values[rows], codes[rows] = self.remote.batch(tokens[rows])
            rest = np.flatnonzero(~remote)
            if rest.size:
                v, c = self._segments_batch(tokens[rest], active[rest], pairs[rest])
                values[rest], codes[rest] = v, c
            return values, codes
        return self._segments_batch(tokens, active, pairs)

    def _segments_batch(
        self, tokens: IntArray, active: IntArray, pairs: IntArray
    ) -> tuple[FloatArray, npt.NDArray[np.int8]]:
        which = np.searchsorted(self._ends_array, tokens, side="left")
        count = tokens.shape[0]
        if count and which.min() == which.max():  # one segment: no copies
            return self._one_segment(int(which[0]), tokens, active, pairs)
        values = np.full(count, np.nan)
        codes = np.full(count, OK, dtype=np.int8)
        # One pass per segment present (a few dozen at most) costs less than sorting the rows.
        present = np.flatnonzero(np.bincount(which, minlength=len(self.segments)))
        for s in present.tolist():
            rows = np.flatnonzero(which == s)
            values[rows], codes[rows] = self._one_segment(
                s, tokens[rows], active[rows], pairs[rows]
            )
        return values, codes

    def _one_segment(
        self, index: int, tokens: IntArray, active: IntArray, pairs: IntArray
    ) -> tuple[FloatArray, npt.NDArray[np.int8]]:
        surface = self.segments[index].surface
        if surface is not None:
            return surface.batch(tokens, active, pairs)
        codes = feasibility_codes(self.geometry, tokens, active, pairs)
        codes[codes == OK] = OUT_OF_SUPPORT
        return np.full(tokens.shape[0], np.nan), codes
