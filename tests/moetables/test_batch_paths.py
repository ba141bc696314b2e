"""The fast paths give the slow paths' answers: vectorised historical batches against the scalar
reader (R42), and DeploymentTables.answer's column-wise reading against query-by-query parsing."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from moetables.bundle import EXPERTS
from moetables.errors import CoverageError, QueryError
from moetables.geometry import ExpertGeometry
from moetables.lookup import INVALID, OK, OUT_OF_SUPPORT, ComponentTables
from moetables.lookup.balanced import BalancedExpertSurface
from moetables.lookup.codes import CODE_NAMES
from moetables.lookup.queries import Query, parse_query
from moetables.lookup.tables import DeploymentTables


def _scalar(surface: BalancedExpertSurface, n: int, a: int, m: int) -> tuple[float, int]:
    try:
        return surface.time(n, a, m), OK
    except QueryError:
        return float("nan"), INVALID
    except CoverageError:
        return float("nan"), OUT_OF_SUPPORT


def _assert_batch_is_scalar(
    surface: BalancedExpertSurface, n: np.ndarray, a: np.ndarray, m: np.ndarray
) -> int:
    values, codes = surface.batch(n, a, m)
    answered = 0
    for i in range(len(n)):
        value, code = _scalar(surface, int(n[i]), int(a[i]), int(m[i]))
        assert codes[i] == code, (n[i], a[i], m[i])
        # bit for bit: the same float operations in the same order
        assert values[i] == value or (np.isnan(values[i]) and np.isnan(value)), (n[i], a[i], m[i])
        answered += code == OK
    return answered


def _queries(geometry: ExpertGeometry, rng: np.random.Generator, count: int, top: int) -> Any:
    n = rng.integers(-1, top, count)
    a = rng.integers(-1, geometry.local_experts + 3, count)
    balanced = -(-n * geometry.top_k * geometry.local_experts // geometry.global_experts)
    m = np.where(rng.random(count) < 0.85, balanced, rng.integers(-1, 4 * top, count))
    remote = rng.random(count) < 0.03
    a[remote] = 0
    m[remote] = 0
    return n, a, m


def test_historical_batches_answer_as_the_scalar_reader(shared_copy: Path) -> None:  # R42
    rng = np.random.default_rng(42)
    for rank in (0, 1):
        deployment = ComponentTables(shared_copy).deployment(1, 2, rank)
        for mode in ("eager", "graph"):
            surface = deployment._experts[(EXPERTS, mode)]
            assert isinstance(surface, BalancedExpertSurface)
            n, a, m = _queries(surface.geometry, rng, 6000, surface.grid[-1] + 200)
            assert _assert_batch_is_scalar(surface, n, a, m) > 2000


@st.composite
def _historical_tables(draw: st.DrawFn) -> tuple[BalancedExpertSurface, int]:
    experts = draw(st.sampled_from([8, 16, 64, 128]))
    top_k = draw(st.integers(1, min(8, experts)))
    local = draw(st.integers(1, experts))
    geometry = ExpertGeometry(experts, top_k, local)
    grid = sorted(draw(st.sets(st.integers(1, 300), min_size=1, max_size=10)))
    rows: list[tuple[int, int, int, float]] = []
    for n in grid:
        m = geometry.balanced_total(n)
        for a in sorted(draw(st.sets(st.integers(1, min(local, m)), min_size=1, max_size=7))):
            if geometry.feasible(n, a, m) and m <= n * a:
                rows.append((n, a, m, draw(st.floats(0.5, 5000.0))))
        if geometry.all_remote_possible and draw(st.booleans()):
            rows.append((n, 0, 0, draw(st.floats(0.5, 50.0))))
    if not any(a > 0 for _, a, _, _ in rows):
        rows.append((grid[0], 1, geometry.balanced_total(grid[0]), 1.0))
    table = np.array(rows)
    surface = BalancedExpertSurface(
        table[:, 0].astype(np.int64),
        table[:, 1].astype(np.int64),
        table[:, 2].astype(np.int64),
        table[:, 3],
        geometry,
        label="t",
    )
    return surface, grid[-1]


@settings(max_examples=60, deadline=None)
@given(_historical_tables(), st.integers(0, 2**32 - 1))
def test_vectorised_historical_batches_equal_the_scalar_path(
    table: tuple[BalancedExpertSurface, int], seed: int
) -> None:
    surface, top = table
    rng = np.random.default_rng(seed)
    n, a, m = _queries(surface.geometry, rng, 400, top + 20)
    _assert_batch_is_scalar(surface, n, a, m)


def test_historical_batches_take_large_coordinates_one_by_one(shared_copy: Path) -> None:
    surface = ComponentTables(shared_copy).deployment(1, 2, 0)._experts[(EXPERTS, "eager")]
    assert isinstance(surface, BalancedExpertSurface)
    big = 2**62
    n = np.array([big, 5, 5, -big, 5] * 4, dtype=np.int64)
    a = np.array([6, big, 6, 6, -big] * 4, dtype=np.int64)
    m = np.array([20, 20, big, 20, 20] * 4, dtype=np.int64)
    _assert_batch_is_scalar(surface, n, a, m)


# -- DeploymentTables.answer ---------------------------------------------------------------


def _reference_answer(deployment: DeploymentTables, queries: list[Any]) -> list[Any]:
    """Query by query through parse_query, grouped in query order, one batch per group."""
    answers: list[Any] = [None] * len(queries)
    groups: dict[tuple[str, str], list[tuple[int, Query]]] = {}
    for i, raw in enumerate(queries):
        try:
            query = parse_query(raw)
            deployment._known(query.component, query.mode)
        except QueryError as exc:
            answers[i] = {"error": "invalid", "message": str(exc)}
            continue
        groups.setdefault((query.component, query.mode), []).append((i, query))
    for (component, mode), members in groups.items():
        n = [q.tokens for _, q in members]
        if component == EXPERTS:
            result = deployment.batch(
                component,
                n,
                [q.activated_experts for _, q in members],
                [q.local_assignments for _, q in members],
                mode=mode,
            )
        else:
            result = deployment.batch(component, n, mode=mode)
        for (i, query), value, code in zip(
            members, result.time_us.tolist(), result.code.tolist(), strict=True
        ):
            answers[i] = {"time_us": value} if code == OK else deployment._refusal(query, code)
    return answers


_ODD = [None, True, False, 3.0, 3.5, "3", -1, 0, 1, 2, 5, 64, 10**6, 2**63 - 1, -(2**63)]


def _mixed_queries(rng: random.Random, count: int, tokens: int) -> list[Any]:
    queries: list[Any] = []
    for _ in range(count):
        kind = rng.random()
        if kind < 0.03:
            queries.append(rng.choice([7, "x", None, [1], 2.5]))
            continue
        if kind < 0.35:
            query: dict[str, Any] = {
                "component": rng.choice(["gate_routing", "finalize_copy"]),
                "tokens": rng.randint(1, tokens),
            }
        else:
            n = rng.randint(1, tokens)
            query = {
                "component": EXPERTS,
                "tokens": n,
                "activated_experts": rng.randint(0, 66),
                "local_assignments": rng.choice([4 * n, rng.randint(0, 8 * n)]),
            }
        if rng.random() < 0.2:
            query["mode"] = rng.choice(["eager", "graph", "other"])
        if rng.random() < 0.15:
            key = rng.choice(
                ["component", "mode", "tokens", "activated_experts", "local_assignments"]
            )
            if rng.random() < 0.4:
                query.pop(key, None)
            else:
                query[key] = rng.choice([*_ODD, "experts", "gate_routing", "graph"])
        queries.append(query)
    return queries


@pytest.mark.parametrize("count", [1, 3, 16, 17, 400, 3000])
def test_answer_reads_columns_as_parse_query_reads_queries(
    shared_copy: Path, current_bundle: Path, count: int
) -> None:
    rng = random.Random(count)
    for root, tokens in ((shared_copy, 5000), (current_bundle, 80)):
        deployment = ComponentTables(root).deployment(1, 2, 0)
        for _ in range(3 if count < 1000 else 1):
            queries = _mixed_queries(rng, count, tokens)
            got = deployment.answer(queries)
            assert json.dumps(got) == json.dumps(_reference_answer(deployment, queries))
            assert {a.get("error") for a in got} <= {None, *CODE_NAMES.values()}


def test_answer_gives_each_query_its_own_answer_on_historical_tables(shared_copy: Path) -> None:
    """Historical batches answer row by row, so a query's answer ignores its neighbours."""
    deployment = ComponentTables(shared_copy).deployment(1, 2, 1)
    queries = _mixed_queries(random.Random(5), 500, 5000)
    together = deployment.answer(queries)
    alone = [deployment.answer([q])[0] for q in queries]
    assert json.dumps(together) == json.dumps(alone)


def test_answer_takes_integers_beyond_int64_one_by_one(shared_copy: Path) -> None:
    deployment = ComponentTables(shared_copy).deployment(1, 2, 0)
    huge = 2**70
    queries: list[Any] = [
        {"component": "gate_routing", "tokens": huge},
        {"component": "gate_routing", "tokens": 4, "activated_experts": huge},
        {"component": EXPERTS, "tokens": 5, "activated_experts": huge, "local_assignments": 20},
        {"component": EXPERTS, "tokens": -huge, "activated_experts": 6, "local_assignments": 20},
    ] * 5
    for batch in (queries[:4], queries):
        answers = deployment.answer(batch)
        assert answers[0]["error"] == "out_of_support" and str(huge) in answers[0]["message"]
        assert answers[1] == deployment.answer([{"component": "gate_routing", "tokens": 4}])[0]
        assert answers[2]["error"] == "invalid" and answers[3]["error"] == "invalid"


def test_answer_words_each_refusal_as_the_scalar_call_does(current_bundle: Path) -> None:
    """R40, R43: a refused query's answer is the scalar call's own error, code and message alike,
    though `answer` words current-layout refusals without locating the point again."""
    deployment = ComponentTables(current_bundle).deployment(1, 2, 0)
    queries = _mixed_queries(random.Random(11), 3000, 120)
    refused = 0
    for query, got in zip(queries, deployment.answer(queries), strict=True):
        if "time_us" in got:
            continue
        refused += 1
        try:
            parsed = parse_query(query)
            deployment.time_us(
                parsed.component,
                parsed.tokens,
                parsed.activated_experts,
                parsed.local_assignments,
                parsed.mode,
            )
        except QueryError as exc:
            assert got == {"error": "invalid", "message": str(exc)}
        except CoverageError as exc:
            assert got == {"error": "out_of_support", "message": str(exc)}
        else:
            raise AssertionError(f"{query}: answer refused what the scalar call answers")
    assert refused > 100
