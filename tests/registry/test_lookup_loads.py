"""Issue 18: POST /api/v1/lookup and moetables.client.RemoteTables take a query's load
description (``loads``, ``tile_cost_us``) and answer bit for bit as in process; the OpenAPI
schema documents both keys (R39, R44)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from moetables import ComponentTables
from moetables.client import RemoteTables
from moetables.errors import CoverageError, QueryError
from registry.bundles.models import Bundle
from registry.bundles.services import publish_bundle

F2 = (
    Path(__file__).resolve().parents[2]
    / "bundles/H200-vllm-modular-f2/Qwen/Qwen3-30B-A3B-Instruct-2507/bf16"
)
TARGET = {"tp": 1, "dp": 2, "rank": 0, "sequence_parallel": False}
EXPERT = {
    "component": "experts",
    "tokens": 2048,
    "activated_experts": 64,
    "local_assignments": 8192,
}
SKEW = [129] * 32 + [127] * 32
QUERIES: list[Any] = [
    EXPERT,
    {**EXPERT, "loads": "balanced"},
    {**EXPERT, "loads": "uniform", "tile_cost_us": 1.6},
    {**EXPERT, "loads": "power_law(1.2)", "tile_cost_us": 1.6},
    {**EXPERT, "loads": SKEW, "tile_cost_us": 1.6},
    {**EXPERT, "tokens": 3000, "local_assignments": 12000, "loads": "uniform", "tile_cost_us": 2},
    {**EXPERT, "tokens": 10**6, "loads": "uniform", "tile_cost_us": 1.6},  # out of support
    {**EXPERT, "loads": "uniform"},  # no cost: the table's own (1.764 us, format 3)
    {**EXPERT, "tile_cost_us": 1.6},  # no description
    {**EXPERT, "loads": [1] * 64, "tile_cost_us": 1.6},  # counts miss M
    {"component": "gate_routing", "tokens": 4, "loads": "uniform", "tile_cost_us": 1},
]
LOCAL = ComponentTables(F2).deployment(1, 2, 0)


@pytest.fixture
def f2(db: None) -> Bundle:
    return publish_bundle(F2).bundle


@pytest.mark.django_db
def test_rest_answers_described_queries_as_moetables(api: Any, f2: Bundle) -> None:
    for copies in (1, 4):  # the one-by-one and the column reader
        response = api.post(
            "/api/v1/lookup",
            json.dumps({"bundle": f2.pk, "target": TARGET, "queries": QUERIES * copies}),
            content_type="application/json",
        )
        assert response.status_code == 200, response.content
        answers = response.json()["answers"]
        assert answers == json.loads(json.dumps(LOCAL.answer(QUERIES * copies)))
    assert answers[0] == answers[1] and answers[2]["time_us"] > answers[0]["time_us"]
    assert answers[6]["error"] == "out_of_support"
    assert answers[7]["time_us"] == LOCAL.experts_time_us(
        2048, 64, 8192, loads="uniform", tile_cost_us=1.764
    )
    assert [a["error"] for a in answers[8:11]] == ["invalid"] * 3
    assert "for experts only" in answers[10]["message"]


@pytest.mark.django_db
def test_the_openapi_schema_documents_the_description(client: Any) -> None:
    response = client.get("/api/schema/", headers={"accept": "application/vnd.oai.openapi+json"})
    schemas = response.json()["components"]["schemas"]
    request = next(s for name, s in schemas.items() if name.startswith("LookupRequest"))
    query = request["properties"]["queries"]["items"]["$ref"].rsplit("/", 1)[1]
    schema = schemas[query]["properties"]
    assert {"loads", "tile_cost_us"} <= set(schema)
    kinds = {alt["type"] for alt in schema["loads"]["oneOf"]}
    assert kinds == {"string", "array"}
    assert "power_law(alpha)" in schema["loads"]["description"]


OPENED: list[RemoteTables] = []


@pytest.fixture
def remote(live_server: Any) -> Iterator[Any]:
    bundle = publish_bundle(F2).bundle
    tables = RemoteTables(live_server.url, bundle=bundle.pk)
    OPENED.append(tables)
    yield tables.deployment(1, 2, 0)
    for t in OPENED:
        t.close()
    OPENED.clear()


def _outcome(call: Any, *args: Any, **kwargs: Any) -> Any:
    try:
        return call(*args, **kwargs)
    except (QueryError, CoverageError) as exc:
        return (type(exc), str(exc))


@pytest.mark.django_db(transaction=True)
def test_remote_tables_pass_descriptions_through_bit_for_bit(remote: Any) -> None:
    assert remote.answer(QUERIES) == LOCAL.answer(QUERIES)
    for kwargs in (
        {"loads": "uniform", "tile_cost_us": 1.6},
        {"loads": "power_law(0.6)", "tile_cost_us": 1.6},
        {"loads": tuple(SKEW), "tile_cost_us": 1.6},
        {"loads": "balanced"},
        {"loads": "uniform"},
        {"tile_cost_us": 1.0},
        {"loads": "zipf", "tile_cost_us": 1.0},
    ):
        args = ("experts", 2048, 64, 8192)
        assert _outcome(remote.time_us, *args, **kwargs) == _outcome(LOCAL.time_us, *args, **kwargs)
        e_kwargs = {"loads": "balanced", **kwargs}
        assert _outcome(remote.experts_time_us, *args[1:], **e_kwargs) == _outcome(
            LOCAL.experts_time_us, *args[1:], **e_kwargs
        )
    assert _outcome(remote.time_us, "gate_routing", 4, loads="uniform", tile_cost_us=1) == (
        _outcome(LOCAL.time_us, "gate_routing", 4, loads="uniform", tile_cost_us=1)
    )
    n, a, m = [2048, 4096, 2048, 10**6], [64, 64, 64, 64], [8192, 16384, 8192, 8192]
    described: tuple[dict[str, Any], ...] = (
        {"loads": "uniform", "tile_cost_us": 1.6},
        {"loads": ["balanced", "power_law(1.2)", SKEW, "uniform"], "tile_cost_us": 1.6},
        {"loads": ["uniform", "uniform", [1] * 64, "uniform"], "tile_cost_us": 1.6},
    )
    for kwargs in described:
        mine, theirs = (
            LOCAL.batch("experts", n, a, m, **kwargs),
            remote.batch("experts", n, a, m, **kwargs),
        )
        assert np.array_equal(mine.time_us, theirs.time_us, equal_nan=True)
        assert np.array_equal(mine.code, theirs.code)
    own = (
        LOCAL.batch("experts", n, a, m, loads="uniform"),
        remote.batch("experts", n, a, m, loads="uniform"),
    )
    assert np.array_equal(own[0].time_us, own[1].time_us, equal_nan=True)
    for kwargs in (
        {"tile_cost_us": 1.0},
        {"loads": ["uniform"], "tile_cost_us": 1.0},
        {"loads": [128] * 4, "tile_cost_us": 1.0},
    ):
        assert _outcome(remote.batch, "experts", n, a, m, **kwargs) == _outcome(
            LOCAL.batch, "experts", n, a, m, **kwargs
        )
    assert _outcome(remote.batch, "gate_routing", [4], loads="uniform", tile_cost_us=1) == (
        _outcome(LOCAL.batch, "gate_routing", [4], loads="uniform", tile_cost_us=1)
    )


H200 = F2.parents[3] / "H200/Qwen/Qwen3-30B-A3B-Instruct-2507/bf16"
# Same targets without a fitted tile cost (format 2).
UNFITTED = F2.parents[3] / "H200-torch-reference/Qwen/Qwen3-30B-A3B-Instruct-2507/bf16"
SPREAD = F2.parents[4] / "docs/evidence/h200-load-spread/load_spread.json"


@pytest.fixture
def fitted_copy(tmp_path: Path) -> Path:
    """The H200 bundle with its tables' fitted tile costs recorded (format 3, issue 18)."""
    import shutil

    from acquisition.load_spread import attach

    bundle = tmp_path / "H200/Qwen/Qwen3-30B-A3B-Instruct-2507/bf16"
    shutil.copytree(H200, bundle)
    attach(bundle, json.loads(SPREAD.read_text()))
    return bundle


@pytest.mark.django_db(transaction=True)
def test_a_tables_own_cost_answers_described_queries_on_every_path(
    live_server: Any, fitted_copy: Path
) -> None:
    """Issue 18 part 2: the table detail states expert_loads; a described query without
    tile_cost_us is charged at the table's cost over REST, through RemoteTables and in process
    alike; the estimate's tile_cost_us="table" too."""
    import requests

    bundle = publish_bundle(fitted_copy).bundle
    detail = requests.get(f"{live_server.url}/api/v1/bundles/{bundle.pk}/", timeout=30).json()
    costs = {
        t["target"]["dp"]: t["expert_loads"]["tile_model"]["tile_cost_us"] for t in detail["tables"]
    }
    assert costs == {1: 1.416, 2: 1.764}
    assert all(t["expert_loads"]["rows"] == "balanced" for t in detail["tables"])
    local = ComponentTables(fitted_copy).deployment(1, 2, 1)
    remote_tables = RemoteTables(live_server.url, bundle=bundle.pk)
    OPENED.append(remote_tables)
    remote = remote_tables.deployment(1, 2, 1)
    assert remote.fitted_tile_cost_us == 1.764
    queries = [{**EXPERT, "loads": "uniform"}, {**EXPERT, "loads": SKEW}]
    assert remote.answer(queries) == local.answer(queries)
    assert local.answer(queries)[0]["time_us"] == local.experts_time_us(
        2048, 64, 8192, loads="uniform", tile_cost_us=1.764
    )
    n, a, m = [2048, 4096], [64, 64], [8192, 16384]
    mine = local.batch("experts", n, a, m, loads="uniform")
    theirs = remote.batch("experts", n, a, m, loads="uniform")
    assert np.array_equal(mine.time_us, theirs.time_us) and (mine.code == 0).all()
    # A bundle without a model still refuses on both paths, alike.
    plain_remote = RemoteTables(live_server.url, bundle=publish_bundle(UNFITTED).bundle.pk)
    OPENED.append(plain_remote)
    refused = _outcome(
        ComponentTables(UNFITTED).deployment(1, 2, 1).batch, "experts", n, a, m, loads="uniform"
    )
    assert isinstance(refused, tuple) and "needs tile_cost_us" in refused[1]
    assert (
        _outcome(plain_remote.deployment(1, 2, 1).batch, "experts", n, a, m, loads="uniform")
        == refused
    )
    body = {
        "bundle": bundle.pk,
        "tp": 1,
        "dp": 2,
        "tokens": [2048, 2048],
        "policy": "round_robin",
        "tile_cost_us": "table",
        "events": False,
    }
    answer = requests.post(f"{live_server.url}/api/v1/estimate", json=body, timeout=30)
    assert answer.status_code == 200, answer.content
    expected = ComponentTables(fitted_copy).estimate(
        [2048, 2048], tp=1, dp=2, policy="round_robin", tile_cost_us=1.764
    )
    assert [r["compute_us"] for r in answer.json()["ranks"]] == [
        r.compute_us for r in expected.ranks
    ]
    for t in OPENED:
        t.close()
    OPENED.clear()


FP8 = F2.parents[3] / "H200-vllm-modular-fp8-f2/Qwen/Qwen3-30B-A3B-Instruct-2507-FP8/fp8"


@pytest.mark.django_db(transaction=True)
def test_the_fp8_tables_64_row_model_travels_to_every_path(live_server: Any) -> None:
    """Issue 18: the FP8 TP1/DP1 table charges its fitted cost where vLLM's block is 64 rows
    (its `tile_model.block_m`); REST, RemoteTables and the estimate answer as moetables does."""
    import requests

    bundle = publish_bundle(FP8).bundle
    detail = requests.get(f"{live_server.url}/api/v1/bundles/{bundle.pk}/", timeout=30).json()
    dp1 = next(t for t in detail["tables"] if t["target"]["dp"] == 1)
    assert dp1["expert_loads"]["tile_model"]["block_m"] == 64
    local = ComponentTables(FP8).deployment(1, 1, 0)
    remote_tables = RemoteTables(live_server.url, bundle=bundle.pk)
    OPENED.append(remote_tables)
    remote = remote_tables.deployment(1, 1, 0)
    assert (remote.tile_block_m, remote.fitted_tile_cost_us) == (64, 0.85)
    # The DP2/EP2 ranks' per-block models (session 11: 64- and 16-row blocks) travel as well.
    rank = remote_tables.deployment(1, 2, 0)
    assert (rank.tile_block_m, rank.fitted_tile_cost_us) == (64, 0.902)
    ranked = [{**q, "tokens": 48, "activated_experts": 40, "local_assignments": 192}
              for q in ({"component": "experts", "loads": "power_law(1.2)"},)]  # fmt: skip
    assert rank.answer(ranked) == ComponentTables(FP8).deployment(1, 2, 0).answer(ranked)
    queries = [
        {"component": "experts", "tokens": 1024, "activated_experts": 128,
         "local_assignments": 8192, "loads": "uniform"},
    ]  # fmt: skip
    answered = remote.answer(queries)
    assert answered == local.answer(queries)
    assert answered[0]["time_us"] > local.time_us("experts", 1024, 128, 8192) + 20
    body = {
        "bundle": bundle.pk,
        "tp": 1,
        "dp": 1,
        "tokens": [1024],
        "policy": "random",
        "seed": 3,
        "tile_cost_us": "table",
        "events": False,
    }
    answer = requests.post(f"{live_server.url}/api/v1/estimate", json=body, timeout=30)
    assert answer.status_code == 200, answer.content
    expected = ComponentTables(FP8).estimate(
        [1024], tp=1, dp=1, policy="random", seed=3, tile_cost_us="table"
    )
    plain = ComponentTables(FP8).estimate(
        [1024], tp=1, dp=1, policy="random", seed=3, tile_cost_us="none"
    )
    assert [r["compute_us"] for r in answer.json()["ranks"]] == [
        r.compute_us for r in expected.ranks
    ]
    assert expected.ranks[0].compute_us > plain.ranks[0].compute_us
    for t in OPENED:
        t.close()
    OPENED.clear()


@pytest.mark.django_db(transaction=True)
def test_the_per_block_costs_travel_to_every_path(live_server: Any) -> None:
    """Issue 18, bundle formats 4 and 5: the bf16 TP1/DP1 table's 128/64-row tile costs and its
    32-row wave cost are stated by the table detail (tile_models) and charged at the block vLLM picks at N by REST, RemoteTables and
    the estimate alike, as moetables charges them (R39)."""
    import requests

    bundle = publish_bundle(F2).bundle
    detail = requests.get(f"{live_server.url}/api/v1/bundles/{bundle.pk}/", timeout=30).json()
    dp1 = next(t for t in detail["tables"] if t["target"]["dp"] == 1)
    stated = {
        m["block_m"]: m.get("tile_cost_us", m.get("wave_cost_us"))
        for m in dp1["expert_loads"]["tile_models"]
    }
    assert stated == {128: 1.416, 64: 0.541, 32: 17.57}  # 32: per wave (format 5)
    local = ComponentTables(F2).deployment(1, 1, 0)
    remote_tables = RemoteTables(live_server.url, bundle=bundle.pk)
    OPENED.append(remote_tables)
    remote = remote_tables.deployment(1, 1, 0)
    assert [remote.tile_cost_at(b) for b in (16, 32, 64, 128)] == [None, None, 0.541, 1.416]
    skew = [40] * 64 + [8] * 64  # 3,072 pairs on 128 experts
    queries = [
        {"component": "experts", "tokens": n, "activated_experts": 128,
         "local_assignments": 8 * n, "loads": loads}
        for n, loads in ((384, skew), (512, "power_law(1.2)"), (2048, "uniform"), (128, "uniform"))
    ]  # fmt: skip
    answered = remote.answer(queries)
    assert answered == local.answer(queries)
    # N = 384 runs 32-row blocks (BLOCK_SIZE_N 256), charged per wave (format 5): 64 experts
    # of 40 pairs run two tiles each, 192 in all: 5 w13 and 6 w2 waves of 264 programs (2 per
    # SM on 132 SMs) against the balanced 128 tiles' 3 and 4; a w2 wave weighs 768/2048.
    waves = (5 - 3) + 0.375 * (6 - 4)
    assert answered[0]["time_us"] == pytest.approx(
        local.time_us("experts", 384, 128, 3072) + 17.57 * waves, abs=1e-9
    )
    assert answered[3]["time_us"] == local.time_us("experts", 128, 128, 1024)  # 16 rows: none
    body = {
        "bundle": bundle.pk,
        "tp": 1,
        "dp": 1,
        "tokens": [384],
        "policy": "random",
        "seed": 5,
        "tile_cost_us": "table",
        "events": False,
    }
    answer = requests.post(f"{live_server.url}/api/v1/estimate", json=body, timeout=30)
    assert answer.status_code == 200, answer.content
    expected = ComponentTables(F2).estimate(
        [384], tp=1, dp=1, policy="random", seed=5, tile_cost_us="table"
    )
    assert [r["compute_us"] for r in answer.json()["ranks"]] == [
        r.compute_us for r in expected.ranks
    ]
    for t in OPENED:
        t.close()
    OPENED.clear()
