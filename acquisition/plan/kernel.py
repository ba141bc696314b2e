"""Plan points where vLLM's Triton expert kernel changes its work, from configuration only.

vLLM 0.26.0's ``TritonExperts`` runs one kernel configuration per call, picked from the rows N
it is given (``try_get_optimal_moe_config``): the tuned file ``E={local experts},N={expert
width},device_name=...json`` if vLLM ships one (the key nearest to N, ties to the smaller key),
else ``get_default_config``. Each configuration (BLOCK_SIZE_M/N/K, GROUP_SIZE_M, warps, stages)
is its own kernel, so the expert time is a different smooth surface on every N segment of one
configuration, with a step between segments (docs/benchmarks.md, "Large errors next to a tile
step"). Without an expert map and with ``N * top_k * 4 <= E_global`` the token sort is skipped
and every pair is its own block (``naive_block_assignment``): one more switch in N.

Inside a segment, ``moe_align_block_size`` pads each expert's pairs to a multiple of
BLOCK_SIZE_M = B. Under the balanced stimulus the row tiles at fixed (N, A) are piecewise linear
in M with corners at M = A*B*j (flat part ends) and A*B*j + A (every expert one pair into its
next tile), j >= 1; the step's share of the time falls as 1/j.

The rule adds, before anything is measured (R10):

- the rows on both sides of every switch in N (t and t + 1), so that no interpolation in N
  spans two kernels;
- at every planned (N, A), the corners A*B*j and A*B*j + A for j = 1 .. ``assignment_steps``
  that lie in the feasible M range (sorted pairs only; naive assignment has no padding).
- at EP1, where M = N k leaves no M axis, the same corners as rows: for every A of the axis and
  every j, the last row before and the first row after each ramp (cheap: one target, and the
  staircase of a few experts' tiles is the largest error there).

Rule v3 (``KERNEL_STEPS_RULE_V3``, ``--moe-kernel-steps v3``) adds both edges of every
ramp, so that each ramp is measured at r = 0, 1, A - 1 and A where M = A*B*j + r. Between r = 0
and r = A the *sum* of row tiles is linear, but the per-expert tile counts are not: at r = 1 the
first expert enters tile j + 1 (the largest expert's tiles, and the last wave's occupancy, step
there), and at r = A - 1 -> A the last one does. v2 measured r = 0 and r = A only, so a query
inside a ramp was interpolated over both of those steps. With r = 1 and A - 1 measured every
piece between measured points has one count of experts per tile count per step: the kernel's
work is linear there whichever of these it follows. At EP1 (M = N k, r moves k pairs a row) the
edges are rows: the first row past the corner and the last row before the ramp's end. Configuration
only (B at N, the A grid, k): R10. The switches are v2's, so a v3 table splits into the same
segments.

Rule v4 (``KERNEL_STEPS_RULE_V4``; ``--moe-kernel-steps v4``, and what ``auto`` and ``on`` plan:
`acquisition.options.resolve.DEFAULT_KERNEL_STEPS_RULE`) is v3 plus A values at EP1
on the rows whose BLOCK_SIZE_M is 16. At EP1 M = N k is pinned to the row, so the per-expert
count M / A, and with it the tiles sum_e ceil(count_e / B), moves only through A; the plan's A
axis (factor 2: k, 2k, 4k, ...) samples it at five values, and v2/v3 measure the tile ridges
M = A B j only at those five A (as rows). Along A at fixed M the balanced tiles are a sawtooth:
A (j + 1) while every expert holds j + 1 tiles (A <= M / (B j + 1)), falling as M - A j (B - 1)
over the ramp M / (B j + 1) < A < M / (B j) where experts drop to j tiles, then A j. v4 adds, at
each such row, both sides of both ends of every ramp for j = 1 .. ``assignment_steps``:
floor(M / (B j + 1)) (the last A at which every expert holds j + 1 tiles or more), the A after
it, ceil(M / (B j)) (the first at which every expert holds j or fewer) and the A before it. Where
every expert holds one tile (A B >= M: most of the A axis at N <= 2 A), the tile count is A
itself and the kernel's live programs A ceil(N_out / BLOCK_SIZE_N) per GEMM fill waves of the
132 SMs times the programs resident per SM, which the configuration does not fix (the residency
fitted on the measurements is not the shared-memory bound: docs/benchmarks.md, "Waves, not
tiles"); there v4 halves the A gap instead (the midpoint of two neighbouring A of the row, both
in the one-tile region). Why 16-row blocks: a 16-row tile does 16 rows of work per read of its
expert's weight slice, so a tile costs about one weight read and the tile count is the time;
at larger blocks a tile is more compute and a padding step a smaller share. EP > 1 keeps v3's
points: its M axis already carries M / A at every planned (N, A), corners included.
Configuration only (B at N, k, the A axis): R10. The switches are again v2's.

The configuration itself comes from `moetables.triton_config` (vLLM 0.26.0's every tuned H200
file, embedded, and ``get_default_config``), the same table the lookups' tile model reads. The
rule is modelled for bf16/fp16 and block FP8 (``fp8_w8a8``, the Triton path: DeepGEMM off) on the
H200; other hardware and quantizations are declined (`KernelStepsError`).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from moetables.triton_config import (
    KERNEL_STEPS_RULE,
    KERNEL_STEPS_RULE_V3,
    KERNEL_STEPS_RULE_V4,
    KERNEL_STEPS_RULES,
    KernelShape,
    KernelSwitches,
    TritonConfig,
    TritonConfigError,
    config_dtype,
    default_config,
    device_family,
)

__all__ = [
    "KERNEL_STEPS_RULE",
    "KERNEL_STEPS_RULES",
    "KERNEL_STEPS_RULE_V3",
    "KERNEL_STEPS_RULE_V4",
    "KernelSteps",
    "KernelStepsError",
    "TritonConfig",
    "default_config",
    "device_family",
    "tuned_config",
]

# KERNEL_STEPS_RULE (v2: every tuned H200 file of vLLM 0.26.0 and block FP8) is owned by
# moetables.triton_config, with the switches it names: the lookups read the same definition. It
# is `KernelSteps`' default argument, not the option's default (v4: options.resolve).
# Corners A*B*j, A*B*j + A for j up to this: the first steps are 100 %, 50 %, 33 % of the tiles
# before them; later ones are within what the geometric grid already resolves.
DEFAULT_ASSIGNMENT_STEPS = 3
# Rule v4 adds A values at EP1 on the rows whose BLOCK_SIZE_M is this (the smallest tile: one
# tile costs about one read of its expert's weight slice, so the tile count is the time).
ACTIVE_STEPS_BLOCK_M = 16


class KernelStepsError(ValueError):
    """The kernel's configuration for this target is not modelled (named in the message)."""


def tuned_config(
    rows: int,
    local_experts: int,
    width: int,
    device: str = "NVIDIA_H200",
    dtype: str | None = None,
    block_shape: tuple[int, int] | None = None,
) -> TritonConfig | None:
    """The tuned file's configuration for ``rows`` (nearest key, ties to the first), if any."""
    shape = KernelShape(device, local_experts, width, dtype, block_shape)
    return shape.config(rows) if shape.tuned is not None else None


@dataclass(frozen=True, slots=True)
class KernelSteps:
    """What the kernel's configuration depends on, for one target; derives the added points."""

    shape: KernelShape
    global_experts: int
    top_k: int
    expert_map: bool
    assignment_steps: int = DEFAULT_ASSIGNMENT_STEPS
    # v2 (the default: the shipped f2k plans), v3 (adds both edges of every padding ramp) or v4
    # (v3 plus A values at EP1's 16-row rows).
    rule: str = KERNEL_STEPS_RULE

    @classmethod
    def for_target(
        cls,
        *,
        hardware: str,
        dtype: str,
        local_experts: int,
        global_experts: int,
        top_k: int,
        width: int,
        quantization: str | None = None,
        weight_block: tuple[int, int] | None = None,
        assignment_steps: int = DEFAULT_ASSIGNMENT_STEPS,
        rule: str = KERNEL_STEPS_RULE,
    ) -> KernelSteps:
        """The rule for a target, or `KernelStepsError` where its configuration is not known.

        ``width`` is the model's expert width: every target here runs full expert parallelism,
        where vLLM keeps experts whole (its MoE tensor-parallel size is 1), so it is also N of
        the config file name at any TP.
        """
        device = device_family(hardware)
        try:
            kernel_dtype, block_shape = config_dtype(dtype, quantization, weight_block)
            shape = KernelShape(device, local_experts, width, kernel_dtype, block_shape)
        except TritonConfigError as exc:
            raise KernelStepsError(str(exc)) from None
        if not shape.embedded:
            raise KernelStepsError(
                f"hardware {hardware!r}: vLLM's tuned Triton configurations for it are not "
                "embedded (moetables/triton_config.py embeds the H200's)"
            )
        if rule not in KERNEL_STEPS_RULES:
            raise KernelStepsError(
                f"kernel-step rule {rule!r} is not known (known: {', '.join(KERNEL_STEPS_RULES)})"
            )
        if assignment_steps < 0:
            raise KernelStepsError(f"assignment_steps must be >= 0, got {assignment_steps}")
        return cls(
            shape=shape,
            global_experts=global_experts,
            top_k=top_k,
            # vLLM builds an expert map whenever experts are split over EP ranks.
            expert_map=local_experts < global_experts,
            assignment_steps=assignment_steps,
            rule=rule,
        )

    @property
    def ramp_edges(self) -> bool:
        """Whether the rule measures both edges of each padding ramp (v3, v4)."""
        return self.rule in (KERNEL_STEPS_RULE_V3, KERNEL_STEPS_RULE_V4)

    @property
    def active_side(self) -> bool:
        """Whether the rule adds A values where the tiles move with A (v4)."""
        return self.rule == KERNEL_STEPS_RULE_V4

    def _active_row(self, rows: int) -> bool:
        # EP1 (M = N k: no M axis), sorted assignment (naive blocks have no padding), 16-row tiles.
        return (
            self.active_side
            and self.local_experts == self.global_experts
            and not self.naive(rows)
            and self.config(rows).block_m == ACTIVE_STEPS_BLOCK_M
        )

    def active_corners(self, rows: int) -> list[int]:
        """v4, at an EP1 row with 16-row tiles: the A where the balanced tiles at M = N k bend.

        For j = 1 .. ``assignment_steps``, both sides of both ends of the ramp
        M / (B j + 1) < A < M / (B j): floor(M / (B j + 1)) and the A after it, ceil(M / (B j))
        and the A before it, inside the row's feasible A (k .. min(L, M) at EP1). Empty elsewhere.
        """
        if not self._active_row(rows):
            return []
        m, b = rows * self.top_k, self.config(rows).block_m
        low, high = self.top_k, min(self.local_experts, m)
        found: set[int] = set()
        for j in range(1, self.assignment_steps + 1):
            full = m // (b * j + 1)  # every expert holds at least B j + 1 pairs up to here
            within = -(-m // (b * j))  # every expert holds at most B j pairs from here
            found.update(a for a in (full, full + 1, within - 1, within) if low <= a <= high)
        return sorted(found)

    def active_points(self, rows: int, axis: Sequence[int]) -> list[int]:
        """v4: the A values added at an EP1 row with 16-row tiles, beside the planned ``axis``:
        its `active_corners`, and the midpoint of every two neighbouring A (after the corners)
        at which every expert holds at most one tile (A B >= M), where the tile count is A."""
        if not axis or not self._active_row(rows):
            return []
        m, b = rows * self.top_k, self.config(rows).block_m
        corners = set(self.active_corners(rows))
        values = sorted(set(axis) | corners)
        middles = {(x + y) // 2 for x, y in itertools.pairwise(values) if x * b >= m and y - x > 1}
        return sorted((corners | middles) - set(axis))

    @property
    def device(self) -> str:
        return self.shape.device

    @property
    def local_experts(self) -> int:
        return self.shape.local_experts

    @property
    def width(self) -> int:
        return self.shape.width

    @property
    def source(self) -> str:
        """Which configuration vLLM uses for this shape: a tuned file's name or the default."""
        return self.shape.source

    def config(self, rows: int) -> TritonConfig:
        return self.shape.config(rows)

    @property
    def switches_rule(self) -> KernelSwitches:
        """The kernel per row count (`moetables.triton_config.KernelSwitches`): the same
        definition the lookups split a kernel-step table by."""
        return KernelSwitches(self.shape, self.global_experts, self.top_k, self.expert_map)

    def naive(self, rows: int) -> bool:
        """``_prepare_expert_assignment``: no expert map and ``rows * top_k * 4 <= E_global``."""
        return self.switches_rule.naive(rows)

    def kernel(self, rows: int) -> tuple[TritonConfig, bool]:
        return self.switches_rule.kernel(rows)

    def row_steps(self, maximum: int) -> list[int]:
        """Rows on both sides of every switch of the kernel in ``[1, maximum]``."""
        rows: set[int] = set()
        for t in self.switches_rule.switches(maximum):
            rows.update((t, t + 1))
        return sorted(rows)

    def row_corners(self, maximum: int, actives: Iterable[int]) -> list[int]:
        """At EP1 (M = N k, so the padding corners are rows): for each A, the last row before
        and the first row after every ramp A*B*j .. A*B*j + A of the row tiles, every j."""
        if self.local_experts != self.global_experts:
            return []
        k = self.top_k
        rows: set[int] = set()
        blocks = {self.config(n).block_m for n in range(1, maximum + 1)}
        for active in actives:
            for b in blocks:
                j = 1
                while (first := -(-(active * b * j) // k)) <= maximum:
                    last = (active * b * j) // k
                    after = -(-(active * b * j + active) // k)
                    if self.config(first).block_m == b and not self.naive(first):
                        edges: tuple[int, ...] = (last, after)
                        if self.ramp_edges:
                            # The first row past the corner, the last row before the ramp ends.
                            edges += (last + 1, max(last + 1, after - 1))
                        rows.update(r for r in edges if 1 <= r <= maximum)
                    j += 1
        return sorted(rows)

    def assignment_corners(self, rows: int, active: int, low: int, high: int) -> list[int]:
        """M = A*B*j and A*B*j + A, j = 1 .. assignment_steps, inside ``[low, high]``."""
        if active < 1 or self.naive(rows):
            return []
        tile = active * self.config(rows).block_m
        # v3: also r = 1 and r = A - 1 past the corner (M = A*B*j + r), the ramp's two edges.
        offsets = (0, 1, active - 1, active) if self.ramp_edges else (0, active)
        corners = {
            m
            for j in range(1, self.assignment_steps + 1)
            for m in (tile * j + r for r in offsets)
            if low <= m <= high
        }
        return sorted(corners)

    def as_dict(self) -> dict[str, Any]:
        """The rule and its inputs, as plans and contracts record them (a v2 record is the one
        the shipped f2k plans hashed, key for key)."""
        record = {
            "rule": self.rule,
            "kernel": "vllm TritonExperts (fused_moe_kernel)",
            **self.shape.as_dict(),
            "global_experts": self.global_experts,
            "top_k": self.top_k,
            "expert_map": self.expert_map,
            "assignment_steps": self.assignment_steps,
            "rows": "t and t+1 at every change of the kernel configuration or of "
            "naive_block_assignment between t and t+1",
            "assignments": "A*B*j and A*B*j+A for j = 1..assignment_steps, B = BLOCK_SIZE_M at N",
        }
        if self.ramp_edges:
            record["assignments"] = (
                "A*B*j, A*B*j+1, A*B*j+A-1 and A*B*j+A for j = 1..assignment_steps, "
                "B = BLOCK_SIZE_M at N"
            )
            record["ramp_rows"] = (
                "at EP1, for every A and j: the last row before A*B*j, the first after it, the "
                "last before A*B*j+A and the first at or after it"
            )
        if self.active_side:
            record["active_rows"] = (
                f"at EP1 on rows with BLOCK_SIZE_M {ACTIVE_STEPS_BLOCK_M}, M = N*k: A = "
                "floor(M/(B*j+1)), +1, ceil(M/(B*j)) and -1 for j = 1..assignment_steps, and "
                "the midpoint of neighbouring A where A*B >= M"
            )
        return record
