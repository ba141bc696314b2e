"""Deployment targets, token domains, expert ownership and the feasible N/A/M region.

Everything here is arithmetic on integers taken from a model's configuration and a deployment;
acquisition plans points with it and lookup checks queries with it, so the two cannot disagree
about what a coordinate means (R1, R2, R4, R5).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from moetables.errors import BundleError

__all__ = [
    "ExpertGeometry",
    "MoeTarget",
    "TokenDomain",
    "balanced_local_assignments",
    "linear_expert_map",
]


@dataclass(frozen=True, slots=True)
class TokenDomain:
    """Rows one rank presents: to its local gate/finalization and to its expert kernel."""

    local_rows: int
    expert_rows: int


@dataclass(frozen=True, slots=True)
class MoeTarget:
    """One deployment rank: TP x DP ranks with full expert parallelism (EP = TP x DP).

    ``rank`` is the rank inside the EP group, ordered DP-major as vLLM orders it
    (``ep_rank = dp_rank * tp + tp_rank``).
    """

    tp: int
    dp: int
    ep: int
    rank: int
    sequence_parallel: bool

    def __post_init__(self) -> None:
        for name in ("tp", "dp", "ep", "rank"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"target.{name} must be an integer, got {value!r}")
        if not isinstance(self.sequence_parallel, bool):
            raise ValueError(
                "target.sequence_parallel must be given explicitly as true or false, "
                f"got {self.sequence_parallel!r}"
            )
        if self.tp < 1 or self.dp < 1:
            raise ValueError(f"target needs tp >= 1 and dp >= 1, got tp={self.tp} dp={self.dp}")
        if self.ep != self.tp * self.dp:
            # Only full EP exists in this method: experts are whole and spread over every rank.
            raise ValueError(
                f"target.ep must equal tp*dp (full expert parallelism): "
                f"tp={self.tp} dp={self.dp} ep={self.ep}"
            )
        if not 0 <= self.rank < self.ep:
            raise ValueError(f"target.rank must be in [0, {self.ep}), got {self.rank}")
        if self.sequence_parallel and not (self.tp > 1 and self.dp > 1):
            raise ValueError(
                "target.sequence_parallel is only meaningful where tp > 1 and dp > 1 "
                f"(tp={self.tp} dp={self.dp})"
            )

    @property
    def dp_rank(self) -> int:
        return self.rank // self.tp

    @property
    def tp_rank(self) -> int:
        return self.rank % self.tp

    @property
    def deployment(self) -> str:
        """The readable folder name of this target's table, e.g. ``dp2_ep2_rank0_sp0``."""
        return f"dp{self.dp}_ep{self.ep}_rank{self.rank}_sp{int(self.sequence_parallel)}"

    @property
    def key(self) -> tuple[int, int, int, bool]:
        """What lookup selects a deployment by (R39, R43)."""
        return (self.tp, self.dp, self.rank, self.sequence_parallel)

    def as_dict(self) -> dict[str, Any]:
        return {
            "tp": self.tp,
            "dp": self.dp,
            "ep": self.ep,
            "rank": self.rank,
            "sequence_parallel": self.sequence_parallel,
        }

    @classmethod
    def from_dict(cls, raw: Any, *, where: str = "target") -> MoeTarget:
        """Parse a target mapping; a malformed one is a `BundleError` naming ``where``."""
        if not isinstance(raw, dict):
            raise BundleError(where, "must be a mapping with tp, dp, ep, rank, sequence_parallel")
        expected = {"tp", "dp", "ep", "rank", "sequence_parallel"}
        missing = expected - raw.keys()
        extra = raw.keys() - expected
        if missing or extra:
            raise BundleError(
                where,
                f"fields must be exactly {sorted(expected)}"
                + (f"; missing {sorted(missing)}" if missing else "")
                + (f"; unexpected {sorted(extra)}" if extra else ""),
            )
        try:
            return cls(
                tp=raw["tp"],
                dp=raw["dp"],
                ep=raw["ep"],
                rank=raw["rank"],
                sequence_parallel=raw["sequence_parallel"],
            )
        except ValueError as exc:
            raise BundleError(where, str(exc)) from None

    @classmethod
    def for_rank(cls, tp: int, dp: int, rank: int, sequence_parallel: bool = False) -> MoeTarget:
        return cls(tp=tp, dp=dp, ep=tp * dp, rank=rank, sequence_parallel=sequence_parallel)

    def token_domains(self, padded_counts: Sequence[int]) -> TokenDomain:
        """Rows of this rank from the already-padded token counts of every DP rank (R2).

        A non-SP rank gate-routes its own n_i rows and its experts see every DP rank's rows.
        An SP rank holds a 1/TP slice: ceil(n_i/TP) local rows, and the experts see the TP
        slices of every DP rank, TP * sum(ceil(n_i/TP)) rows.
        """
        if len(padded_counts) != self.dp:
            raise ValueError(
                f"need one padded count per DP rank ({self.dp}), got {len(padded_counts)}"
            )
        if any(isinstance(n, bool) or not isinstance(n, int) or n < 0 for n in padded_counts):
            raise ValueError(
                f"padded counts must be non-negative integers, got {list(padded_counts)}"
            )
        own = padded_counts[self.dp_rank]
        if self.sequence_parallel:
            slices = [math.ceil(n / self.tp) for n in padded_counts]
            return TokenDomain(local_rows=slices[self.dp_rank], expert_rows=self.tp * sum(slices))
        return TokenDomain(local_rows=own, expert_rows=sum(padded_counts))


def linear_expert_map(global_experts: int, ep: int, rank: int) -> list[int]:
    """Global-to-local expert map of one EP rank under vLLM's linear placement (R4).

    Each rank owns E // ep consecutive experts; the first E % ep ranks own one more.
    Entries are the local index, or -1 for an expert this rank does not own.
    """
    if global_experts < 1 or ep < 1 or not 0 <= rank < ep:
        raise ValueError(f"bad expert placement: E={global_experts} ep={ep} rank={rank}")
    base, remainder = divmod(global_experts, ep)
    local = base + (1 if rank < remainder else 0)
    start = rank * base + min(rank, remainder)
    mapping = [-1] * global_experts
    for i in range(local):
        mapping[start + i] = i
    return mapping


def balanced_local_assignments(
    tokens: int, top_k: int, local_experts: int, global_experts: int
) -> int:
    """Local token-expert pairs of a rank when routing spreads evenly over every expert.

    ceil(N*k*L/E), the total the historical balanced tables store: it never falls below the
    feasible lower bound and never exceeds N*min(k, L).
    """
    return -(-tokens * top_k * local_experts // global_experts)


@dataclass(frozen=True, slots=True)
class ExpertGeometry:
    """What the feasible N/A/M region depends on: E global experts, top-k, L local experts."""

    global_experts: int
    top_k: int
    local_experts: int

    def __post_init__(self) -> None:
        if not (1 <= self.top_k <= self.global_experts):
            raise ValueError(
                f"need 1 <= top_k <= global_experts, got k={self.top_k} E={self.global_experts}"
            )
        if not (1 <= self.local_experts <= self.global_experts):
            raise ValueError(
                f"need 1 <= local_experts <= global_experts, got L={self.local_experts} "
                f"E={self.global_experts}"
            )

    @classmethod
    def for_target(cls, global_experts: int, top_k: int, target: MoeTarget) -> ExpertGeometry:
        local = sum(1 for e in linear_expert_map(global_experts, target.ep, target.rank) if e >= 0)
        return cls(global_experts=global_experts, top_k=top_k, local_experts=local)

    @property
    def remote_experts(self) -> int:
        return self.global_experts - self.local_experts

    @property
    def all_remote_possible(self) -> bool:
        """Whether a token can place all k choices on other ranks (A=M=0 is a real point)."""
        return self.remote_experts >= self.top_k

    @property
    def collapsed(self) -> bool:
        """At EP1 every choice is local: M = N*k, so M is not an independent axis."""
        return self.remote_experts == 0

    def assignment_bounds(self, tokens: int, active: int) -> tuple[int, int]:
        """Inclusive [low, high] of M for positive work at (N, A)."""
        low = max(active, tokens * max(0, self.top_k - self.remote_experts))
        high = tokens * min(self.top_k, active)
        return low, high

    def feasible(self, tokens: int, active: int, assignments: int) -> bool:
        """Whether (N, A, M) can be produced by N tokens each with k distinct experts (R5)."""
        if tokens < 1:
            return False
        if active == 0 and assignments == 0:
            return self.all_remote_possible
        if not 1 <= active <= self.local_experts:
            return False
        low, high = self.assignment_bounds(tokens, active)
        return low <= assignments <= high

    def infeasibility(self, tokens: int, active: int, assignments: int) -> str:
        """Which bound (N, A, M) breaks, in plain words; empty when the point is feasible."""
        n, a, m, k, local = tokens, active, assignments, self.top_k, self.local_experts
        remote = self.remote_experts
        if n < 1:
            return f"N={n}: a query needs at least one token row"
        if a == 0 and m == 0:
            if self.all_remote_possible:
                return ""
            return (
                f"A=M=0 means every token's {k} experts are remote, but only {remote} of "
                f"the {self.global_experts} experts live on other ranks"
            )
        if a < 1:
            return f"A={a} with M={m}: local pairs need at least one active local expert"
        if a > local:
            return f"A={a} active experts, but this rank owns only {local} experts"
        low, high = self.assignment_bounds(n, a)
        if m < a:
            return (
                f"M={m} pairs cannot keep A={a} experts busy: every active expert has at "
                "least one token-expert pair"
            )
        if m < low:
            return (
                f"each of the N={n} tokens picks {k} distinct experts and only {remote} "
                f"are remote, so at least {k - remote} per token are local: M >= {low}"
            )
        if m > high:
            return (
                f"each of the N={n} tokens picks at most min(k={k}, A={a}) = {min(k, a)} "
                f"of the active local experts: M <= {high}"
            )
        return ""

    def balanced_total(self, tokens: int) -> int:
        return balanced_local_assignments(
            tokens, self.top_k, self.local_experts, self.global_experts
        )
