"""The one definition of a well-formed estimate request: the CLI and the REST API read it here.

A request names the deployment (tp, dp, sequence_parallel), one step (``tokens``: the padded
count of every DP rank) or many (``steps``: a list of such lists), the routing policy and its
inputs, and the mode. The answer is `LayerEstimate.as_dict` per step, or a refusal
``{"error": "invalid" | "out_of_support", "message": ...}`` naming the rank and component.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from moetables.comm import Cluster
from moetables.errors import QueryError
from moetables.estimate import (
    AUTO_TILE_COST,
    MODES,
    NO_TILE_COST,
    TABLE_TILE_COST,
    TILE_COST_WORDS,
    estimator_for,
)
from moetables.profiles import ProfileError, RoutingProfile, profile_from_json
from moetables.routing import POLICIES, ActiveCurve
from moetables.tiles import MAX_TILE_COST_US, valid_tile_cost

__all__ = [
    "EstimateRequest",
    "EstimateRequestError",
    "answer_estimate",
    "parse_estimate_request",
]

_FIELDS = {
    "tp",
    "dp",
    "sequence_parallel",
    "tokens",
    "steps",
    "policy",
    "expert_counts",
    "seed",
    "active_curve",
    "load_shares",
    "mode",
    "capture_sizes",
    "events",
    "rank_expert_counts",
    "profile",
    "layer",
    "profile_draw",
    "tile_cost_us",
    "first_step",
}
PROFILE_DRAWS = ("sample", "expectation")
_INT64_MAX = 2**63 - 1
# Policies that count pairs per expert, so that each rank's per-expert counts exist
# (captured: when drawn, not as its expectation).
COUNTING_POLICIES = ("histogram", "round_robin", "random", "captured")


class EstimateRequestError(QueryError):
    """A malformed estimate request: its message joins the problems with '; ', and
    ``problems`` keeps them apart (a problem's own text may hold '; ')."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = list(problems)


@dataclass(frozen=True, slots=True)
class EstimateRequest:
    tp: int
    dp: int
    sequence_parallel: bool
    steps: list[list[int]]
    single: bool  # one step given as ``tokens``: answer one object, not a list
    policy: str
    expert_counts: list[list[int]] | None
    seed: int
    active_curve: ActiveCurve | None
    load_shares: list[float] | None
    mode: str
    capture_sizes: list[int] | None
    events: bool = True  # the per-rank trace events (a timeline); false for smaller answers
    # Each rank's pairs per local expert in its answer (opt-in: E numbers per step).
    rank_expert_counts: bool = False
    profile: RoutingProfile | None = None  # the captured policy's routing profile
    layer: int | None = None  # its layer (None: every layer)
    captured_expectation: bool = False  # the mean (A, M) rather than a seeded draw
    # Issue 18: the charge for row tiles beyond the table's balanced ones: a number (us per
    # tile), "table", "auto" (the default) or "none" (`ComponentTables.estimate_batch`).
    tile_cost_us: float | str | None = AUTO_TILE_COST
    # The seeded policies draw step i from the stream (seed, first_step + i).
    first_step: int = 0


def _int(raw: Mapping[str, Any], key: str, low: int, problems: list[str], default: int) -> int:
    value = raw.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int):
        problems.append(f"{key}: must be an integer, got {value!r}")
        return default
    if value < low:
        problems.append(f"{key}: must be at least {low}, got {value}")
    return value


def _int_list(value: Any, what: str, problems: list[str]) -> list[int] | None:
    if (
        not isinstance(value, list)
        or not value
        or any(isinstance(v, bool) or not isinstance(v, int) for v in value)
    ):
        problems.append(f"{what}: must be a non-empty list of integers, got {value!r}")
        return None
    too_big = [v for v in value if abs(v) > _INT64_MAX]
    if too_big:  # numpy would overflow: named here rather than a server error
        problems.append(f"{what}: {too_big[0]} does not fit a 64-bit integer")
        return None
    return value


def _profile(value: Any, problems: list[str]) -> RoutingProfile | None:
    """A loaded profile (the CLI's --profile, the registry's id resolved), or one inline."""
    if value is None or isinstance(value, RoutingProfile):
        return value
    if isinstance(value, Mapping):
        try:
            return profile_from_json(value)
        except ProfileError as exc:
            where = str(exc)  # the reader names the profile (and its field) itself
            problems.append(where if where.startswith("profile") else f"profile: {where}")
            return None
    problems.append(
        "profile: give a routing profile inline ({meta, step_tokens, counts}); a profile id is "
        f"resolved by the registry, got {value!r}"
    )
    return None


def parse_estimate_request(
    raw: Any, *, max_steps: int = 100_000, extra: frozenset[str] = frozenset()
) -> EstimateRequest:
    """Check a request; every problem is named (EstimateRequestError, a QueryError: all of
    them joined in its message, and listed in its ``problems``)."""
    if not isinstance(raw, Mapping):
        raise EstimateRequestError(["an estimate request must be a JSON object"])
    problems: list[str] = []
    unknown = sorted(set(raw) - _FIELDS - extra)
    if unknown:
        problems.append(f"unknown field(s) {unknown}; known are {sorted(_FIELDS | extra)}")
    tp = _int(raw, "tp", 1, problems, 1)
    dp = _int(raw, "dp", 1, problems, 1)
    if "tp" not in raw or "dp" not in raw:
        problems.append("tp and dp are required")
    sp = raw.get("sequence_parallel", False)
    if not isinstance(sp, bool):
        problems.append(f"sequence_parallel: must be true or false, got {sp!r}")
        sp = False
    single = "tokens" in raw
    if single == ("steps" in raw):
        problems.append("give one step as tokens or many as steps (not both, not neither)")
    steps: list[list[int]] = []
    if single:
        one = _int_list(raw["tokens"], "tokens", problems)
        steps = [one] if one is not None else []
    elif "steps" in raw:
        value = raw["steps"]
        if not isinstance(value, list) or not value:
            problems.append("steps: must be a non-empty list of token lists")
        elif len(value) > max_steps:
            problems.append(f"steps: at most {max_steps} steps per request")
        else:
            for i, row in enumerate(value):
                got = _int_list(row, f"steps[{i}]", problems)
                if got is None:
                    break
                steps.append(got)
    for i, row in enumerate(steps):
        if len(row) != dp:
            problems.append(f"step {i}: needs one token count per DP rank ({dp}), got {len(row)}")
            break
    policy = raw.get("policy", "balanced")
    if policy not in POLICIES:
        problems.append(f"policy: unknown routing policy {policy!r}; known are {list(POLICIES)}")
    mode = raw.get("mode", "eager")
    if mode not in MODES:
        problems.append(f"mode: must be one of {list(MODES)}, got {mode!r}")
    seed = _int(raw, "seed", 0, problems, 0)
    first_step = _int(raw, "first_step", 0, problems, 0)
    counts = raw.get("expert_counts")
    expert_counts: list[list[int]] | None = None
    if counts is not None:
        rows = counts if single is False else [counts]
        if not isinstance(rows, list):
            problems.append("expert_counts: must be a list of integers (per step for steps)")
        else:
            expert_counts = []
            for i, row in enumerate(rows):
                got = _int_list(
                    row, f"expert_counts[{i}]" if not single else "expert_counts", problems
                )
                if got is None:
                    expert_counts = None
                    break
                expert_counts.append(got)
            if expert_counts is not None and len(expert_counts) != len(steps):
                problems.append(f"expert_counts: {len(expert_counts)} rows for {len(steps)} steps")
    curve = None
    if raw.get("active_curve") is not None:
        try:
            curve = ActiveCurve.parse(raw["active_curve"])
        except QueryError as exc:
            problems.append(f"active_curve: {exc}")
    shares = raw.get("load_shares")
    if shares is not None and (
        not isinstance(shares, list)
        or any(isinstance(s, bool) or not isinstance(s, (int, float)) for s in shares)
    ):
        problems.append(f"load_shares: must be a list of numbers, got {shares!r}")
        shares = None
    sizes = raw.get("capture_sizes")
    if sizes is not None:
        sizes = _int_list(sizes, "capture_sizes", problems)
    events = raw.get("events", True)
    if not isinstance(events, bool):
        problems.append(f"events: must be true or false, got {events!r}")
    profile = _profile(raw.get("profile"), problems)
    layer = raw.get("layer")
    if layer is not None and (isinstance(layer, bool) or not isinstance(layer, int) or layer < 0):
        problems.append(f"layer: must be a non-negative integer, got {layer!r}")
    draw = raw.get("profile_draw", "sample")
    if draw not in PROFILE_DRAWS:
        problems.append(f"profile_draw: must be one of {list(PROFILE_DRAWS)}, got {draw!r}")
    if policy == "captured" and profile is None and "profile" not in raw:
        problems.append("profile: the captured policy needs a routing profile")
    if policy != "captured":
        for key in ("profile", "layer", "profile_draw"):
            if raw.get(key) is not None:
                problems.append(f"{key}: belongs to the captured policy, not {policy!r}")
    per_expert = raw.get("rank_expert_counts", False)
    if not isinstance(per_expert, bool):
        problems.append(f"rank_expert_counts: must be true or false, got {per_expert!r}")
        per_expert = False
    if per_expert and policy in POLICIES and policy not in COUNTING_POLICIES:
        problems.append(
            f"rank_expert_counts: the {policy} policy gives no per-expert counts; "
            f"{', '.join(COUNTING_POLICIES)} do"
        )
    if per_expert and policy == "captured" and draw == "expectation":
        problems.append(
            "rank_expert_counts: the captured policy's expectation gives no per-expert counts; "
            "its draws do"
        )
    # Absent (or null): the default, "auto" (each rank's table's model where the policy gives
    # per-expert counts and every table records one; nothing elsewhere).
    tile_cost = raw.get("tile_cost_us")
    if tile_cost is None:
        tile_cost = AUTO_TILE_COST
    if tile_cost not in (AUTO_TILE_COST, NO_TILE_COST):
        if tile_cost != TABLE_TILE_COST and not valid_tile_cost(tile_cost):  # 1e309 reads inf
            problems.append(
                f"tile_cost_us: must be a finite number >= 0 (at most {MAX_TILE_COST_US:,.0f} us) "
                f"or one of {list(TILE_COST_WORDS)}, got {tile_cost!r}"
            )
        elif policy in POLICIES and policy not in COUNTING_POLICIES:
            problems.append(
                f"tile_cost_us: the {policy} policy gives no per-expert counts to tile; "
                f"{', '.join(COUNTING_POLICIES)} do"
            )
        elif policy == "captured" and draw == "expectation":
            problems.append(
                "tile_cost_us: the captured policy's expectation gives no per-expert counts; its draws do"
            )
    if problems:
        raise EstimateRequestError(problems)
    return EstimateRequest(
        tp=tp,
        dp=dp,
        sequence_parallel=sp,
        steps=steps,
        single=single,
        policy=policy,
        expert_counts=expert_counts,
        seed=seed,
        first_step=first_step,
        active_curve=curve,
        load_shares=[float(s) for s in shares] if shares is not None else None,
        mode=mode,
        capture_sizes=sizes,
        events=events,
        rank_expert_counts=per_expert,
        profile=profile,
        layer=layer,
        captured_expectation=draw == "expectation",
        tile_cost_us=tile_cost if isinstance(tile_cost, str) else float(tile_cost),
    )


def answer_estimate(
    tables: Any, request: EstimateRequest, cluster: Cluster | None
) -> dict[str, Any] | list[dict[str, Any]]:
    """The answer: one object for ``tokens``, a list (one per step) for ``steps``.

    Raises QueryError for an input no step can use (a wrong policy input, say) and
    CoverageError when the bundle has no table for a rank; a step outside measured support
    is refused in its own answer.
    """
    estimator = estimator_for(tables, request.tp, request.dp, request.sequence_parallel)
    batch = estimator.estimate_batch(
        np.array(request.steps, dtype=np.int64),
        policy=request.policy,
        cluster=cluster,
        mode=request.mode,
        expert_counts=request.expert_counts,
        active_curve=request.active_curve,
        load_shares=request.load_shares,
        seed=request.seed,
        capture_sizes=request.capture_sizes,
        profile=request.profile,
        layer=request.layer,
        captured_expectation=request.captured_expectation,
        tile_cost_us=request.tile_cost_us,
        first_step=request.first_step,
    )
    if request.single:
        # A refusal raises, naming rank and component.
        answer = batch.step(0).as_dict(expert_counts=request.rank_expert_counts)
        if not request.events:
            del answer["events"]
        return answer
    return batch.as_dicts(events=request.events, expert_counts=request.rank_expert_counts)
