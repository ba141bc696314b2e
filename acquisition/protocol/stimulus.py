"""Routing stimuli that meet an (N, A, M) point exactly (R20).

Every token keeps the checkpoint's full global top-k with k distinct experts. The M local
token-expert pairs form a balanced histogram over A local experts (counts differ by at most
one); the other choices go to remote experts, also spread evenly. No trained router is
imitated: different histograms with the same N, A, M share one table row, and the table
approximates them by this balanced one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

if TYPE_CHECKING:
    from collections.abc import Sequence

    from moetables.geometry import ExpertGeometry

__all__ = ["RoutingStimulus", "StimulusError", "routing_stimulus"]


class StimulusError(ValueError):
    """The requested point cannot be produced by N tokens with k distinct experts each."""


@dataclass(frozen=True, slots=True)
class RoutingStimulus:
    """One expert forward's routing: global ids and weights of every token's k choices."""

    tokens: int
    activated_experts: int
    local_assignments: int
    topk_ids: npt.NDArray[np.int64]
    topk_weights: npt.NDArray[np.float32]

    def rotated(self, expert_map: Sequence[int], offset: int) -> RoutingStimulus:
        """The same routing with local expert positions shifted by ``offset`` (mod L).

        Rotation moves the work to other local experts (and so other weights) while N, A and
        M stay exactly as they were (R17); remote choices are untouched.
        """
        mapping = np.asarray(expert_map, dtype=np.int64)
        local_globals = _local_globals(mapping)
        count = local_globals.size
        if count == 0 or offset % count == 0:
            return self
        local = mapping[self.topk_ids]
        shifted = local_globals[(local + offset) % count]
        ids = np.where(local >= 0, shifted, self.topk_ids)
        return RoutingStimulus(
            tokens=self.tokens,
            activated_experts=self.activated_experts,
            local_assignments=self.local_assignments,
            topk_ids=ids.astype(np.int64),
            topk_weights=self.topk_weights,
        )


def _local_globals(mapping: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """Global id of each local expert, indexed by its local position."""
    owned = np.flatnonzero(mapping >= 0)
    by_position = np.empty(owned.size, dtype=np.int64)
    by_position[mapping[owned]] = owned
    return by_position


def _split_evenly(total: int, parts: int) -> list[int]:
    base, extra = divmod(total, parts)
    return [base + 1 if i < extra else base for i in range(parts)]


def _dealt_ids(
    n: int,
    k: int,
    a: int,
    m: int,
    local_globals: npt.NDArray[np.int64],
    remote_globals: npt.NDArray[np.int64],
) -> npt.NDArray[np.int64]:
    """Each row's local run and remote remainder, before the shuffle.

    Row r takes l_r local choices (``_split_evenly(m, n)``), the local slots following on
    from the pairs dealt to earlier rows (mod A), then k - l_r remote slots following on from
    the earlier rows' remote choices (mod R). Array arithmetic, not a loop over rows: a point
    of 2048 tokens is built in well under a millisecond (issue 19).
    """
    per_token = np.array(_split_evenly(m, n) if m else [0] * n, dtype=np.int64)
    pairs_before = np.cumsum(per_token) - per_token
    remote_before = np.cumsum(k - per_token) - (k - per_token)
    column = np.arange(k, dtype=np.int64)[None, :]
    local = column < per_token[:, None]
    ids = np.empty((n, k), dtype=np.int64)
    if local.any():
        slots = (pairs_before[:, None] + column) % max(a, 1)
        ids[local] = local_globals[slots[local]]
    if not local.all():
        # Feasibility keeps every remainder within R distinct remote experts (R > 0 here).
        slots = (remote_before[:, None] + column - per_token[:, None]) % remote_globals.size
        ids[~local] = remote_globals[slots[~local]]
    return ids


def routing_stimulus(
    geometry: ExpertGeometry,
    expert_map: Sequence[int],
    tokens: int,
    activated_experts: int,
    local_assignments: int,
    *,
    seed: int = 0,
) -> RoutingStimulus:
    """Top-k ids and weights for ``tokens`` rows meeting (N, A, M) exactly.

    Local pairs are dealt round-robin over the first A local experts, each token taking a
    consecutive run of its l_n local choices (distinct because l_n <= A); l_n differs by at
    most one between tokens and stays in [max(0, k - R), min(k, A)], so the remote remainder
    of every token fits in R distinct remote experts. ``seed`` shuffles the order of each
    token's choices and draws the weights, reproducibly.
    """
    n, a, m = tokens, activated_experts, local_assignments
    if not geometry.feasible(n, a, m):
        raise StimulusError(
            f"N={n} A={a} M={m} is infeasible for E={geometry.global_experts} "
            f"k={geometry.top_k} L={geometry.local_experts}"
        )
    mapping = np.asarray(expert_map, dtype=np.int64)
    if mapping.size != geometry.global_experts:
        raise StimulusError("expert map must list every global expert")
    local_globals = _local_globals(mapping)
    remote_globals = np.flatnonzero(mapping < 0)
    if local_globals.size != geometry.local_experts:
        raise StimulusError("expert map and geometry disagree on the local expert count")
    k = geometry.top_k
    ids = _dealt_ids(n, k, a, m, local_globals, remote_globals)
    rng = np.random.default_rng(seed)
    # Column order carries no meaning for routing; shuffling keeps local choices from always
    # sitting in the first slots, as a real router would not put them there.
    order = np.argsort(rng.random((n, k)), axis=1)
    ids = np.take_along_axis(ids, order, axis=1)
    weights = rng.random((n, k), dtype=np.float32) + np.float32(0.5)
    weights /= weights.sum(axis=1, keepdims=True)
    return RoutingStimulus(
        tokens=n,
        activated_experts=a,
        local_assignments=m,
        topk_ids=ids,
        topk_weights=weights.astype(np.float32),
    )
