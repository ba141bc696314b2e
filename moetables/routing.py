"""Routing policies: one step's per-DP-rank token counts to every EP rank's (rows, N, A, M).

A step is the already-padded token count of each DP rank. Token domains (R2) give each EP rank
its local rows and the gathered rows N its expert kernel sees; a policy then says which local
experts get how many token-expert pairs (R41):

- ``balanced``: the method's expected rank load, rounded up as the balanced tables store it,
  M = ceil(N*k*L/E), spread evenly over the rank's experts (A = min(L, M));
- ``custom``: the same loads (or the user's per-rank load shares), with the number of active
  experts from the user's active-expert curve A(N); it gives no per-expert histogram;
- ``round_robin``: the step's N*k pairs dealt to experts in turn, then counted per rank;
- ``random``: every token picks k distinct experts uniformly (seeded, reproducible), counted;
- ``histogram``: the step's global per-expert pair counts (what a router chose, as vLLM's
  router capture gives them) mapped through each rank's linear expert map: exact A and M;
- ``captured``: drawn from a routing profile (`moetables.profiles`) at the step's N (seeded):
  a captured step with exactly N rows is taken as it was; otherwise a captured step with more
  rows (or, above every captured step, the layer's whole-run shares) gives each expert's chance
  of being picked by a token, and N tokens pick k distinct experts with exactly those chances
  (systematic sampling in a random expert order); ``captured_expectation=True``
  gives the mean per-rank (A, M) instead (over the captured steps at N, else from the shares
  assuming independent tokens), rounded to a feasible point.

The counting policies conserve pairs: the ranks' M add up to N*k. The expected-load policies
round each rank's share up (the balanced total of R41), so their sum can exceed N*k by less than
one pair per rank. Every answer is feasible under R5, or the policy raises a `QueryError`
naming the rank.

Token domains, expert ownership and feasibility are `moetables.geometry`'s rules (R2, R4, R5),
written here over arrays of steps; tests/moetables/test_routing.py checks every answer against
`MoeTarget.token_domains` and `ExpertGeometry.feasible` themselves.
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from moetables.errors import QueryError
from moetables.geometry import ExpertGeometry, MoeTarget, linear_expert_map
from moetables.profiles import RoutingProfile, read_profile

__all__ = [
    "POLICIES",
    "ActiveCurve",
    "BatchRouting",
    "Deployment",
    "RankLoad",
    "StepRouting",
    "route",
    "route_batch",
]

POLICIES = ("balanced", "custom", "round_robin", "random", "histogram", "captured")

IntArray = npt.NDArray[np.int64]


@dataclass(frozen=True, slots=True)
class Deployment:
    """A whole deployment (every EP rank), with the checkpoint's expert count and top-k."""

    tp: int
    dp: int
    sequence_parallel: bool
    global_experts: int
    top_k: int

    def __post_init__(self) -> None:
        # MoeTarget checks tp, dp and the SP flag; ExpertGeometry checks E and k.
        MoeTarget.for_rank(self.tp, self.dp, 0, self.sequence_parallel)
        ExpertGeometry(self.global_experts, self.top_k, 1)

    @property
    def ep(self) -> int:
        return self.tp * self.dp

    def target(self, rank: int) -> MoeTarget:
        return MoeTarget.for_rank(self.tp, self.dp, rank, self.sequence_parallel)

    def geometry(self, rank: int) -> ExpertGeometry:
        return ExpertGeometry.for_target(self.global_experts, self.top_k, self.target(rank))

    def expert_ranges(self) -> list[tuple[int, int]]:
        """[start, stop) of each rank's global experts under linear placement (R4)."""
        return list(_expert_ranges(self.global_experts, self.ep))

    def local_experts(self) -> list[int]:
        return [stop - start for start, stop in _expert_ranges(self.global_experts, self.ep)]


@functools.lru_cache(maxsize=256)
def _expert_ranges(global_experts: int, ep: int) -> tuple[tuple[int, int], ...]:
    ranges = []
    for rank in range(ep):
        owned = [
            e for e, local in enumerate(linear_expert_map(global_experts, ep, rank)) if local >= 0
        ]
        ranges.append((owned[0], owned[-1] + 1))
    return tuple(ranges)


@dataclass(frozen=True, slots=True)
class ActiveCurve:
    """A user's active-expert curve: distinct experts active over the whole deployment at N
    gathered rows, linear between the given points and refused outside them."""

    tokens: tuple[int, ...]
    active: tuple[float, ...]

    def __post_init__(self) -> None:
        if len(self.tokens) < 1 or len(self.tokens) != len(self.active):
            raise QueryError("the active-expert curve needs one or more [N, A] points")
        if any(b <= a for a, b in zip(self.tokens, self.tokens[1:], strict=False)):
            raise QueryError("the active-expert curve's N must increase strictly")
        if any(a < 0 or not math.isfinite(a) for a in self.active):
            raise QueryError("the active-expert curve's A must be finite and non-negative")

    @classmethod
    def parse(cls, raw: object) -> ActiveCurve:
        """From ``[[N, A], ...]`` as the CLI and REST API take it."""
        if not isinstance(raw, (list, tuple)) or not raw:
            raise QueryError("active_curve must be a non-empty list of [N, A] pairs")
        tokens: list[int] = []
        active: list[float] = []
        for point in raw:
            if (
                not isinstance(point, (list, tuple))
                or len(point) != 2
                or isinstance(point[0], bool)
                or not isinstance(point[0], int)
                or isinstance(point[1], bool)
                or not isinstance(point[1], (int, float))
            ):
                raise QueryError(f"active_curve point {point!r} is not [N (int), A (number)]")
            tokens.append(point[0])
            active.append(float(point[1]))
        return cls(tuple(tokens), tuple(active))

    def at(self, tokens: IntArray) -> npt.NDArray[np.float64]:
        low, high = self.tokens[0], self.tokens[-1]
        outside = (tokens < low) | (tokens > high)
        if outside.any():
            bad = int(tokens[outside][0])
            raise QueryError(
                f"custom policy: N={bad} is outside the active-expert curve's range "
                f"[{low}, {high}] (a curve is never extrapolated)"
            )
        return np.interp(tokens, self.tokens, self.active)


@dataclass(frozen=True, slots=True)
class RankLoad:
    """What one EP rank computes in one step."""

    rank: int
    dp_rank: int
    tp_rank: int
    local_rows: int
    tokens: int  # N: gathered rows presented to the expert kernel
    activated_experts: int  # A
    local_assignments: int  # M
    # Pairs per local expert, in local expert order, where the policy counts them.
    expert_counts: tuple[int, ...] | None = None


@dataclass(frozen=True, slots=True)
class StepRouting:
    policy: str
    padded_tokens: tuple[int, ...]
    ranks: tuple[RankLoad, ...]
    notes: tuple[str, ...] = field(default=())


@dataclass(frozen=True, slots=True)
class BatchRouting:
    """Many steps at once: arrays of shape (steps, ranks), N of shape (steps,)."""

    policy: str
    padded_tokens: IntArray  # (steps, dp)
    local_rows: IntArray  # (steps, ep)
    tokens: IntArray  # (steps,)
    activated_experts: IntArray  # (steps, ep)
    local_assignments: IntArray  # (steps, ep)
    expert_counts: IntArray | None  # (steps, E) global pairs per expert, where counted

    def step(self, i: int, deployment: Deployment) -> StepRouting:
        ranges = deployment.expert_ranges()
        ranks = []
        for r in range(deployment.ep):
            counts = None
            if self.expert_counts is not None:
                start, stop = ranges[r]
                counts = tuple(int(c) for c in self.expert_counts[i, start:stop])
            ranks.append(
                RankLoad(
                    rank=r,
                    dp_rank=r // deployment.tp,
                    tp_rank=r % deployment.tp,
                    local_rows=int(self.local_rows[i, r]),
                    tokens=int(self.tokens[i]),
                    activated_experts=int(self.activated_experts[i, r]),
                    local_assignments=int(self.local_assignments[i, r]),
                    expert_counts=counts,
                )
            )
        return StepRouting(self.policy, tuple(int(n) for n in self.padded_tokens[i]), tuple(ranks))


def _counts_array(tokens_per_rank: object, dp: int) -> IntArray:
    """Steps as an int64 array (steps, dp); a clear error for anything else."""
    try:
        raw = np.asarray(tokens_per_rank)
    except (ValueError, TypeError):
        raise QueryError("token counts must be a list of integers per DP rank") from None
    if raw.ndim == 1:
        raw = raw[None, :]
    if raw.ndim != 2 or raw.shape[1] != dp:
        raise QueryError(
            f"need one padded token count per DP rank ({dp}) for each step, got shape "
            f"{list(raw.shape)}"
        )
    if raw.dtype.kind == "b":
        raise QueryError("token counts must be integers, got booleans")
    if raw.size and raw.dtype.kind not in "iu":
        if raw.dtype.kind == "f" and np.all(np.isfinite(raw)) and np.all(raw == np.round(raw)):
            raw = raw.astype(np.int64)
        else:
            raise QueryError("token counts must be integers")
    counts = raw.astype(np.int64)
    if counts.size and counts.min() < 1:
        step, dp_rank = (int(v) for v in np.argwhere(counts < 1)[0])
        raise QueryError(
            f"step {step}: DP rank {dp_rank} has {int(counts[step, dp_rank])} tokens; an idle "
            "DP rank still runs a padded dummy batch in vLLM, so give its padded count (>= 1)"
        )
    return counts


def _domains(deployment: Deployment, counts: IntArray) -> tuple[IntArray, IntArray]:
    """Local rows (steps, ep) and gathered rows N (steps,) by R2, for every step at once."""
    tp = deployment.tp
    dp_of_rank = np.arange(deployment.ep) // tp
    if deployment.sequence_parallel:
        slices = -(-counts // tp)
        return slices[:, dp_of_rank], tp * slices.sum(axis=1)
    return counts[:, dp_of_rank], counts.sum(axis=1)


def _from_histogram(
    deployment: Deployment, counts: IntArray, tokens: IntArray
) -> tuple[IntArray, IntArray]:
    """Per-rank A and M of global per-expert pair counts (steps, E) through the expert maps."""
    ranges = deployment.expert_ranges()
    starts = np.array([start for start, _ in ranges], dtype=np.intp)
    pairs = np.add.reduceat(counts, starts, axis=1)
    active = np.add.reduceat((counts > 0).astype(np.int64), starts, axis=1)
    return active, pairs


def _check_histogram(deployment: Deployment, counts: IntArray, tokens: IntArray) -> None:
    k = deployment.top_k
    if counts.ndim != 2 or counts.shape[1] != deployment.global_experts:
        raise QueryError(
            f"histogram policy: expert counts need one entry per global expert "
            f"({deployment.global_experts}) per step, got shape {list(counts.shape)}"
        )
    if counts.size and counts.min() < 0:
        step, expert = (int(v) for v in np.argwhere(counts < 0)[0])
        raise QueryError(f"histogram policy: step {step}: expert {expert} has a negative count")
    over = counts > tokens[:, None]
    if over.any():
        step, expert = (int(v) for v in np.argwhere(over)[0])
        raise QueryError(
            f"histogram policy: step {step}: expert {expert} has {int(counts[step, expert])} "
            f"pairs but only N={int(tokens[step])} rows exist (a token picks an expert once)"
        )
    total = counts.sum(axis=1)
    wrong = total != tokens * k
    if wrong.any():
        step = int(np.flatnonzero(wrong)[0])
        raise QueryError(
            f"histogram policy: step {step}: expert counts add up to {int(total[step])} pairs "
            f"but the step has N x k = {int(tokens[step])} x {k} = {int(tokens[step]) * k}"
        )


def _round_robin_counts(deployment: Deployment, tokens: IntArray) -> IntArray:
    """Pair j of token t goes to expert (t*k + j) mod E: k distinct experts per token."""
    e = deployment.global_experts
    pairs = tokens * deployment.top_k
    base, extra = pairs // e, pairs % e
    return base[:, None] + (np.arange(e)[None, :] < extra[:, None]).astype(np.int64)


def _random_counts(
    deployment: Deployment, tokens: IntArray, seed: int, first_step: int = 0
) -> IntArray:
    """Each token draws k distinct experts uniformly; step i uses the stream
    (seed, first_step + i)."""
    e, k = deployment.global_experts, deployment.top_k
    out = np.zeros((tokens.shape[0], e), dtype=np.int64)
    for i, n in enumerate(tokens.tolist()):
        rng = np.random.default_rng([seed, first_step + i])
        chosen = np.argpartition(rng.random((n, e)), k - 1, axis=1)[:, :k]
        out[i] = np.bincount(chosen.ravel(), minlength=e)
    return out


def is_count(value: object) -> bool:
    """A non-negative Python integer (not a bool): a seed, a step index."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _check_seed(policy: str, seed: object, first_step: object = 0) -> None:
    for name, value in (("seed", seed), ("first_step", first_step)):
        if not is_count(value):
            raise QueryError(
                f"{policy} policy: {name} must be a non-negative integer, got {value!r}"
            )


def _profile_file(path: str) -> RoutingProfile:
    """A profile named by its path, read and validated once per process and file version (a
    batch of steps, or a simulator calling once a step, must not re-read it each time); a
    rewritten file (another size or modification time) is read again."""
    try:
        stat = Path(path).stat()
    except OSError:
        stamp = None  # read_profile names the missing file
    else:
        stamp = (stat.st_size, stat.st_mtime_ns)
    return _read_profile_once(path, stamp)


@functools.lru_cache(maxsize=8)
def _read_profile_once(path: str, stamp: tuple[int, int] | None) -> RoutingProfile:
    return read_profile(path)


def _profile_layer(profile: RoutingProfile, layer: object) -> int | None:
    """The layer's position in the profile's arrays, or None for all layers."""
    if layer is None:
        return None
    if isinstance(layer, bool) or not isinstance(layer, int):
        raise QueryError(f"captured policy: layer must be an integer, got {layer!r}")
    if layer not in profile.layers:
        raise QueryError(
            f"captured policy: layer {layer} is not in the profile; it has {profile.layers}"
        )
    return profile.layers.index(layer)


def _pick_k(
    rng: np.random.Generator, chances: npt.NDArray[np.float64], tokens: int, k: int
) -> IntArray:
    """N tokens, each picking k distinct experts, expert e with probability ``chances[e]``
    (each in [0, 1], adding up to k); the counts of each expert over the tokens.

    Systematic sampling: the experts laid out in a random order as intervals of their
    chances on [0, k), and token t takes the experts under u_t, u_t + 1, ..., u_t + k - 1
    (u_t uniform in [0, 1)); an interval is at most 1 long, so no expert twice. One order per
    step, shared by its tokens: each expert's count is Binomial(N, chance) as with an order per
    token, and so are the mean and variance of any rank's pairs (the conditional mean given
    the order does not depend on it), at N k log E instead of N E log E work.
    """
    e = chances.shape[0]
    order = rng.permutation(e)
    cumulative = np.cumsum(chances[order])
    cumulative *= k / cumulative[-1]
    cumulative[-1] = k  # float rounding must not leave the last point past the end
    points = rng.random(tokens)[:, None] + np.arange(k)[None, :]
    slot = np.minimum(np.searchsorted(cumulative, points, side="right"), e - 1)
    return np.bincount(order[slot].ravel(), minlength=e).astype(np.int64)


def _chances(counts: npt.NDArray[Any], rows: float, k: int) -> npt.NDArray[np.float64]:
    """Per-token pick chances from pair counts over ``rows`` tokens, renormalised to add up to
    exactly k (float rounding) and kept in [0, 1]."""
    chances = np.clip(counts.astype(np.float64) / rows, 0.0, 1.0)
    total = chances.sum()
    return chances * (k / total) if total > 0 else np.full(chances.shape, k / chances.size)


def captured_counts(
    profile: RoutingProfile,
    position: int | None,
    tokens: IntArray,
    seed: int,
    first_step: int = 0,
) -> IntArray:
    """Per step a global per-expert histogram of N = ``tokens[i]`` rows drawn from the profile
    (see the module's ``captured``); step i uses the stream (seed, first_step + i);
    ``position`` is the layer's index in the profile, or None to draw the layer too."""
    e, k = profile.global_experts, profile.top_k
    captured = profile.step_tokens
    by_size = np.argsort(captured, kind="stable")
    sizes = captured[by_size]
    layer_count = profile.counts.shape[1]
    pooled: dict[int, npt.NDArray[np.float64]] = {}
    out = np.zeros((tokens.shape[0], e), dtype=np.int64)
    for i, n in enumerate(tokens.tolist()):
        rng = np.random.default_rng([seed, first_step + i])
        lay = int(rng.integers(layer_count)) if position is None else position
        low = int(np.searchsorted(sizes, n, side="left"))
        high = int(np.searchsorted(sizes, n, side="right"))
        if high > low:  # steps of exactly N rows: one of them, as it was
            out[i] = profile.counts[int(by_size[low + rng.integers(high - low)]), lay]
            continue
        if high < sizes.size:  # a larger step's per-token chances
            s = int(by_size[high + rng.integers(sizes.size - high)])
            chances = _chances(profile.counts[s, lay], float(captured[s]), k)
        else:  # above every captured step: the layer's whole-run chances
            if lay not in pooled:
                pooled[lay] = _chances(profile.totals[lay], float(captured.sum()), k)
            chances = pooled[lay]
        out[i] = _pick_k(rng, chances, n, k)
    return out


def _captured_expectation(
    deployment: Deployment, profile: RoutingProfile, position: int | None, tokens: IntArray
) -> tuple[IntArray, IntArray]:
    """Mean per-rank (A, M) at each step's N, rounded to a feasible point: the mean over the
    captured steps of exactly N rows, else from the whole-run shares with independent tokens
    (A = sum over local experts of 1 - (1 - p_e)^N, M = N x sum of p_e)."""
    ep, k = deployment.ep, deployment.top_k
    layer = None if position is None else profile.layers[position]
    stats = profile.rank_statistics(ep, layer)
    captured_n, group = np.unique(stats.tokens, return_inverse=True)
    size = np.bincount(group)[:, None].astype(np.float64)
    sum_a = np.zeros((captured_n.size, ep))
    sum_m = np.zeros((captured_n.size, ep))
    np.add.at(sum_a, group, stats.activated_experts)
    np.add.at(sum_m, group, stats.local_assignments)
    shares = np.clip(profile.load_shares(layer), 0.0, 1.0)
    starts = np.array([s for s, _ in deployment.expert_ranges()], dtype=np.intp)
    local = np.array(deployment.local_experts(), dtype=np.int64)
    where = np.minimum(np.searchsorted(captured_n, tokens), captured_n.size - 1)
    hit = captured_n[where] == tokens
    mean_a = np.where(hit[:, None], (sum_a / size)[where], 0.0)
    mean_m = np.where(hit[:, None], (sum_m / size)[where], 0.0)
    miss = np.flatnonzero(~hit)
    if miss.size:
        n = tokens[miss].astype(np.float64)[:, None]
        mean_a[miss] = np.add.reduceat(1.0 - (1.0 - shares[None, :]) ** n, starts, axis=1)
        mean_m[miss] = n * np.add.reduceat(shares, starts)[None, :]
    # M: largest remainders so that the ranks still add up to N x k.
    exact = mean_m * ((tokens * k)[:, None] / np.maximum(mean_m.sum(axis=1), 1e-300)[:, None])
    floor = np.floor(exact).astype(np.int64)
    short = tokens * k - floor.sum(axis=1)
    order = np.argsort(-(exact - floor), axis=1, kind="stable")
    bump = np.zeros_like(floor)
    np.put_along_axis(
        bump, order, (np.arange(ep)[None, :] < short[:, None]).astype(np.int64), axis=1
    )
    pairs = floor + bump
    # A: rounded, inside what M allows on the rank (R5).
    low = np.where(pairs > 0, np.maximum(1, -(-pairs // tokens[:, None])), 0)
    active = np.clip(np.floor(mean_a + 0.5).astype(np.int64), low, np.minimum(local, pairs))
    return active, pairs


def _expected_loads(
    deployment: Deployment, tokens: IntArray, shares: Sequence[float] | None
) -> IntArray:
    """M per rank: ceil(N*k*L/E) (R41's rounded expected load), or the user's shares of N*k
    rounded by largest remainder so that they still add up to N*k."""
    local = np.array(deployment.local_experts(), dtype=np.int64)
    k, e = deployment.top_k, deployment.global_experts
    if shares is None:
        return -(-(tokens[:, None] * k * local[None, :]) // e)
    numbers = (
        not isinstance(shares, (str, bytes))
        and isinstance(shares, (Sequence, np.ndarray))
        and all(
            isinstance(v, (int, float, np.integer, np.floating))
            and not isinstance(v, (bool, np.bool_))
            for v in np.ravel(np.asarray(shares, dtype=object))
        )
    )
    s = np.asarray(shares, dtype=np.float64) if numbers else np.empty(0)
    if s.shape != (deployment.ep,) or not np.all(np.isfinite(s)) or s.min() < 0:
        raise QueryError(
            f"custom policy: load shares need one non-negative number per EP rank "
            f"({deployment.ep}), got {shares!r}"
        )
    if abs(s.sum() - 1.0) > 1e-6:
        raise QueryError(f"custom policy: load shares must add up to 1, got {s.sum():g}")
    exact = (tokens * k)[:, None] * s[None, :]
    floor = np.floor(exact).astype(np.int64)
    short = tokens * k - floor.sum(axis=1)
    # Largest remainders first, lower rank first on ties: deterministic and conserving.
    order = np.argsort(-(exact - floor), axis=1, kind="stable")
    bump = np.zeros_like(floor)
    ranks = np.arange(deployment.ep)[None, :]
    np.put_along_axis(bump, order, (ranks < short[:, None]).astype(np.int64), axis=1)
    return floor + bump


def _check_feasible(
    deployment: Deployment, policy: str, tokens: IntArray, active: IntArray, pairs: IntArray
) -> None:
    """Every (N, A, M) must be producible by N tokens with k distinct experts each (R5)."""
    k = deployment.top_k
    for rank, local in enumerate(deployment.local_experts()):
        remote = deployment.global_experts - local
        a, m = active[:, rank], pairs[:, rank]
        zero = (a == 0) & (m == 0)
        low = np.maximum(a, tokens * max(0, k - remote))
        high = tokens * np.minimum(k, a)
        ok = np.where(zero, remote >= k, (a >= 1) & (a <= local) & (low <= m) & (m <= high))
        if not ok.all():
            step = int(np.flatnonzero(~ok)[0])
            n, ai, mi = int(tokens[step]), int(a[step]), int(m[step])
            raise QueryError(
                f"{policy} policy: step {step}: rank {rank} gets N={n} A={ai} M={mi}, which no "
                f"routing of N tokens with top-{k} over {deployment.global_experts} experts "
                f"({local} local) can produce"
            )


def route_batch(
    deployment: Deployment,
    tokens_per_rank: object,
    policy: str = "balanced",
    *,
    expert_counts: object = None,
    active_curve: ActiveCurve | object = None,
    load_shares: Sequence[float] | None = None,
    seed: int = 0,
    profile: RoutingProfile | None = None,
    layer: int | None = None,
    captured_expectation: bool = False,
    first_step: int = 0,
) -> BatchRouting:
    """Route many steps at once; ``tokens_per_rank`` is (steps, dp) or one step (dp,).

    ``first_step``: the seeded policies (random, captured) draw step i of this call from the
    stream (seed, first_step + i), so a long run asked a chunk (or a step) at a time gets the
    draws one call for all of it would."""
    if policy not in POLICIES:
        raise QueryError(f"unknown routing policy {policy!r}; known are {list(POLICIES)}")
    counts = _counts_array(tokens_per_rank, deployment.dp)
    local_rows, tokens = _domains(deployment, counts)
    if policy != "histogram" and expert_counts is not None:
        raise QueryError(f"expert counts belong to the histogram policy, not {policy!r}")
    if policy != "custom" and (active_curve is not None or load_shares is not None):
        raise QueryError(
            f"an active-expert curve and load shares belong to the custom policy, not {policy!r}"
        )
    if policy != "captured" and (profile is not None or layer is not None):
        raise QueryError(
            f"a routing profile and layer belong to the captured policy, not {policy!r}"
        )
    histogram: IntArray | None = None
    captured_loads: tuple[IntArray, IntArray] | None = None
    if policy == "captured":
        if profile is None:
            raise QueryError("captured policy needs a routing profile")
        if isinstance(profile, (str, os.PathLike)):
            profile = _profile_file(os.fspath(profile))
        if isinstance(profile, int) and not isinstance(profile, bool):
            raise QueryError(
                f"captured policy: profile {profile} names a published profile, which only a "
                "registry holds: use moetables.client.RemoteTables, or pass the profile file"
            )
        if not isinstance(profile, RoutingProfile):
            raise QueryError(
                "captured policy: profile must be a RoutingProfile or a profile file's path "
                f"(moetables.read_profile), got {type(profile).__name__}"
            )
        _check_seed(policy, seed, first_step)
        position = _profile_layer(profile, layer)
        if (profile.global_experts, profile.top_k) != (deployment.global_experts, deployment.top_k):
            raise QueryError(
                f"captured policy: the profile routes E={profile.global_experts} top-"
                f"{profile.top_k}, the deployment has E={deployment.global_experts} top-"
                f"{deployment.top_k}"
            )
        if captured_expectation:
            captured_loads = _captured_expectation(deployment, profile, position, tokens)
        else:
            histogram = captured_counts(profile, position, tokens, seed, first_step)
    elif policy == "histogram":
        if expert_counts is None:
            raise QueryError("histogram policy needs the step's global per-expert pair counts")
        try:
            raw = np.asarray(expert_counts)
        except (ValueError, TypeError):
            raise QueryError("expert counts must be a list of integers per step") from None
        if raw.ndim == 1:
            raw = raw[None, :]
        if raw.size and raw.dtype.kind not in "iu":
            raise QueryError("expert counts must be integers")
        histogram = raw.astype(np.int64)
        if histogram.shape[0] != tokens.shape[0]:
            raise QueryError(
                f"histogram policy: {histogram.shape[0]} rows of expert counts for "
                f"{tokens.shape[0]} steps"
            )
        _check_histogram(deployment, histogram, tokens)
    elif policy == "round_robin":
        histogram = _round_robin_counts(deployment, tokens)
    elif policy == "random":
        _check_seed(policy, seed, first_step)
        histogram = _random_counts(deployment, tokens, seed, first_step)
    if captured_loads is not None:
        active, pairs = captured_loads
    elif histogram is not None:
        active, pairs = _from_histogram(deployment, histogram, tokens)
    else:
        local = np.array(deployment.local_experts(), dtype=np.int64)
        if policy == "balanced":
            pairs = _expected_loads(deployment, tokens, None)
            active = np.minimum(local[None, :], pairs)
        else:  # custom
            if active_curve is None:
                raise QueryError("custom policy needs an active-expert curve A(N)")
            curve = (
                active_curve
                if isinstance(active_curve, ActiveCurve)
                else ActiveCurve.parse(active_curve)
            )
            pairs = _expected_loads(deployment, tokens, load_shares)
            # The curve counts experts over the whole deployment; a rank holds its L/E of them,
            # kept inside what its M allows: at least ceil(M/N) experts, at most min(L, M).
            share = curve.at(tokens)[:, None] * local[None, :] / deployment.global_experts
            wanted = np.floor(share + 0.5).astype(np.int64)
            lowest = np.where(pairs > 0, np.maximum(1, -(-pairs // tokens[:, None])), 0)
            active = np.clip(wanted, lowest, np.minimum(local[None, :], pairs))
    _check_feasible(deployment, policy, tokens, active, pairs)
    return BatchRouting(
        policy=policy,
        padded_tokens=counts,
        local_rows=local_rows,
        tokens=tokens,
        activated_experts=active,
        local_assignments=pairs,
        expert_counts=histogram,
    )


def route(
    deployment: Deployment,
    tokens_per_rank: Sequence[int],
    policy: str = "balanced",
    *,
    expert_counts: Sequence[int] | None = None,
    active_curve: ActiveCurve | object = None,
    load_shares: Sequence[float] | None = None,
    seed: int = 0,
    profile: RoutingProfile | None = None,
    layer: int | None = None,
    captured_expectation: bool = False,
) -> StepRouting:
    """Route one step: every EP rank's (local rows, N, A, M)."""
    batch = route_batch(
        deployment,
        [list(tokens_per_rank)],
        policy,
        expert_counts=None if expert_counts is None else [list(expert_counts)],
        active_curve=active_curve,
        load_shares=load_shares,
        seed=seed,
        profile=profile,
        layer=layer,
        captured_expectation=captured_expectation,
    )
    return batch.step(0, deployment)
