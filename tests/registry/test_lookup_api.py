"""POST /api/v1/lookup: the answers of moetables, per query, over REST."""

from __future__ import annotations

import io
import json
from typing import TYPE_CHECKING, Any

import pytest
from django.core.cache import cache

from moetables import cli
from moetables.lookup import ComponentTables
from registry.bundles.services import checkout_bundle, publish_bundle
from registry.lookup import services as lookup_service

if TYPE_CHECKING:
    from pathlib import Path

    from rest_framework.test import APIClient

    from registry.bundles.models import Bundle

pytestmark = pytest.mark.django_db

TARGET = {"tp": 1, "dp": 2, "rank": 0, "sequence_parallel": False}
QUERIES: list[dict[str, Any]] = [
    {"component": "gate_routing", "tokens": 1},  # a measured row: returned as stored
    {"component": "gate_routing", "mode": "eager", "tokens": 3},
    {"component": "gate_routing", "tokens": 5},  # between measured rows
    {"component": "finalize_copy", "tokens": 64},
    {"component": "experts", "tokens": 1, "activated_experts": 4, "local_assignments": 4},
    {"component": "experts", "tokens": 6, "activated_experts": 4, "local_assignments": 24},
    {"component": "experts", "tokens": 1, "activated_experts": 0, "local_assignments": 0},
    {
        "component": "experts",
        "mode": "graph",
        "tokens": 8,
        "activated_experts": 8,
        "local_assignments": 32,
    },
    {"component": "gate_routing", "tokens": 1_000_000},  # beyond measured support
    {"component": "no_such_component", "tokens": 1},
    {"component": "experts", "tokens": 1, "activated_experts": 9, "local_assignments": 1},
]


def lookup(api: APIClient, body: Any) -> Any:
    return api.post("/api/v1/lookup", json.dumps(body), content_type="application/json")


def direct(root: Path, target: dict[str, Any], queries: list[dict[str, Any]]) -> list[Any]:
    deployment = ComponentTables(root).deployment(
        target["tp"], target["dp"], target["rank"], sequence_parallel=target["sequence_parallel"]
    )
    # Through JSON, as a client receives them.
    answers: list[Any] = json.loads(json.dumps(deployment.answer(queries)))
    return answers


def test_it_answers_like_moetables(api: APIClient, published: Bundle, shipped: Path) -> None:
    response = lookup(api, {"bundle": published.pk, "target": TARGET, "queries": QUERIES})
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["bundle"] == {
        "id": published.pk,
        "sha256": published.sha256,
        "backend": "vllm-modular",
        "kernel": "TRITON",
        "native": True,
        "vllm_version": "0.28.0",
    }
    # R-issue 13: what answered is in the headers too, for a simulator to record.
    assert response["X-Bundle-Id"] == str(published.pk)
    assert response["X-Bundle-Sha256"] == published.sha256
    assert response["X-Bundle-Backend"] == "vllm-modular"
    assert response["X-Bundle-Vllm-Version"] == "0.28.0"
    assert body["target"] == {**TARGET, "ep": 2}
    assert body["answers"] == direct(shipped, TARGET, QUERIES)
    answers = body["answers"]
    assert answers[0] == {"time_us": 5.471}
    assert answers[4] == {"time_us": 41.0895}
    assert answers[8]["error"] == "out_of_support"
    assert answers[9]["error"] == "invalid"
    assert answers[10]["error"] == "invalid"
    assert all(("time_us" in a) != ("error" in a) for a in answers)


def test_it_prints_what_the_moetables_command_prints(
    api: APIClient,
    published: Bundle,
    shipped: Path,
    tmp_path: Path,
) -> None:
    """The REST answers equal ``python -m moetables lookup`` on the same queries, line by line."""
    queries = tmp_path / "queries.jsonl"
    queries.write_text("".join(json.dumps(q) + "\n" for q in QUERIES))
    out = io.StringIO()
    code = cli.main(
        [
            "lookup",
            str(shipped),
            "--tp",
            "1",
            "--dp",
            "2",
            "--rank",
            "0",
            "--queries",
            str(queries),
        ],
        out=out,
    )
    assert code == 0
    printed = [json.loads(line) for line in out.getvalue().splitlines()]
    body = lookup(api, {"bundle": published.pk, "target": TARGET, "queries": QUERIES}).json()
    assert body["answers"] == printed


def test_it_answers_every_rank_of_the_bundle(
    api: APIClient,
    published: Bundle,
    shipped: Path,
) -> None:
    target = {**TARGET, "rank": 1}
    body = lookup(api, {"bundle": published.pk, "target": target, "queries": QUERIES}).json()
    assert body["answers"] == direct(shipped, target, QUERIES)
    assert body["answers"][0] == {"time_us": 5.311999999999999}


def test_it_answers_a_current_layout_bundle(api: APIClient, make_bundle: Any) -> None:
    folder = make_bundle(tp=2, dp=2, experts=16)
    bundle = publish_bundle(folder).bundle
    target = {"tp": 2, "dp": 2, "rank": 3, "sequence_parallel": False}
    queries = [
        {"component": "gate_routing", "tokens": 4},
        {"component": "finalize_copy", "tokens": 3},
        {"component": "experts", "tokens": 8, "activated_experts": 2, "local_assignments": 8},
        {"component": "experts", "tokens": 3, "activated_experts": 2, "local_assignments": 4},
        {"component": "experts", "tokens": 500, "activated_experts": 2, "local_assignments": 8},
    ]
    body = lookup(api, {"sha256": bundle.sha256, "target": target, "queries": queries}).json()
    assert body["answers"] == direct(folder, target, queries)


def test_it_finds_the_latest_bundle_by_hardware_model_and_variant(
    api: APIClient,
    published: Bundle,
    make_bundle: Any,
) -> None:
    older = publish_bundle(make_bundle(hardware="H100", model="m/x", scale=1.0)).bundle
    newer = publish_bundle(make_bundle(hardware="H100", model="m/x", scale=2.0)).bundle
    assert newer.published_at >= older.published_at
    body = {
        "hardware": "H100",
        "model": "m/x",
        "variant": "bf16",
        "target": {"tp": 1, "dp": 1, "rank": 0},
        "queries": [{"component": "gate_routing", "tokens": 1}],
    }
    response = lookup(api, body).json()
    assert response["bundle"]["id"] == newer.pk
    assert response["answers"] == [{"time_us": 2 * 5.1}]


def test_it_accepts_an_empty_batch(api: APIClient, published: Bundle) -> None:
    response = lookup(api, {"bundle": published.pk, "target": TARGET})
    assert response.status_code == 200
    assert response.json()["answers"] == []


def test_it_answers_non_object_queries_as_invalid_in_place(
    api: APIClient,
    published: Bundle,
) -> None:
    queries = [7, {"component": "gate_routing", "tokens": 1}, "x"]
    answers = lookup(api, {"bundle": published.pk, "target": TARGET, "queries": queries}).json()[
        "answers"
    ]
    assert answers[0]["error"] == answers[2]["error"] == "invalid"
    assert answers[1] == {"time_us": 5.471}


def test_it_says_when_no_bundle_matches(api: APIClient, published: Bundle) -> None:
    for ref in (
        {"bundle": published.pk + 1},
        {"sha256": "0" * 64},
        {"hardware": "X", "model": "Y", "variant": "Z"},
    ):
        response = lookup(api, {**ref, "target": TARGET, "queries": []})
        assert response.status_code == 404
        assert response.json()["error"] == "not_found"


def test_it_says_when_the_bundle_has_no_table_for_the_target(
    api: APIClient,
    published: Bundle,
) -> None:
    target = {"tp": 1, "dp": 1, "rank": 0, "sequence_parallel": False}
    response = lookup(api, {"bundle": published.pk, "target": target, "queries": QUERIES})
    assert response.status_code == 422
    assert response.json()["error"] == "no_coverage"
    assert response.json()["message"]


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        ([], "JSON object"),
        ({"bundle": 1, "target": TARGET, "queries": {"a": 1}}, "queries: must be a list"),
        ({"bundle": 1}, "target"),
        ({"target": TARGET}, "name the bundle: bundle (id or sha256)"),
        ({"bundle": 1, "sha256": "0" * 64, "target": TARGET}, "name the bundle once"),
        ({"hardware": "x", "target": TARGET}, "go together"),
        ({"bundle": 1, "target": {**TARGET, "ep": 3}}, "ep must equal tp*dp"),
        ({"bundle": 1, "target": {**TARGET, "rank": 2}}, "rank must be below ep"),
        ({"bundle": 1, "target": {**TARGET, "tp": 0}}, "target.tp: must be at least 1"),
        ({"bundle": 1, "target": {**TARGET, "dp": "2"}}, "target.dp: must be an integer"),
        ({"bundle": 1, "target": {**TARGET, "sequence_parallel": 1}}, "true or false"),
        ({"bundle": "one", "target": TARGET}, "bundle: must be a positive integer"),
        ({"sha256": "ABC", "target": TARGET}, "sha256: must be 64"),
    ],
)
def test_it_refuses_malformed_requests(
    api: APIClient,
    published: Bundle,
    body: Any,
    fragment: str,
) -> None:
    response = lookup(api, body)
    assert response.status_code == 400
    assert fragment in json.dumps(response.json())


def test_it_refuses_malformed_json(api: APIClient, db: None) -> None:
    response = api.post("/api/v1/lookup", "{not json", content_type="application/json")
    assert response.status_code == 400


def test_it_limits_the_batch_size(api: APIClient, published: Bundle, settings: Any) -> None:
    settings.REGISTRY = {**settings.REGISTRY, "MAX_LOOKUP_QUERIES": 2}
    response = lookup(api, {"bundle": published.pk, "target": TARGET, "queries": QUERIES[:3]})
    assert response.status_code == 400
    assert response.json()["problems"] == ["queries: at most 2 queries per request"]


def test_it_keeps_loaded_tables_for_the_process(
    api: APIClient,
    published: Bundle,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    loads: list[Path] = []
    original = lookup_service.ComponentTables

    def counting(path: Path) -> Any:
        loads.append(path)
        return original(path)

    monkeypatch.setattr(lookup_service, "ComponentTables", counting)
    body = {"bundle": published.pk, "target": TARGET, "queries": QUERIES[:1]}
    for _ in range(3):
        assert lookup(api, body).status_code == 200
    assert len(loads) == 1


def test_it_reports_a_corrupt_checkout_as_a_conflict(api: APIClient, published: Bundle) -> None:
    folder = checkout_bundle(published)
    table = folder / published.tables.get(rank=0).table_path
    table.chmod(0o644)
    table.write_bytes(table.read_bytes() + b"\r\n")
    codes = [
        lookup(api, {"bundle": published.pk, "target": t, "queries": QUERIES[:1]})
        for t in (TARGET, {**TARGET, "rank": 1})
    ]
    assert [c.status_code for c in codes] == [409, 200]
    assert codes[0].json()["error"] == "corrupt_bundle"
    assert "checksum" in codes[0].json()["message"]


def test_it_throttles_lookups_when_a_rate_is_set(
    api: APIClient,
    published: Bundle,
    settings: Any,
) -> None:
    cache.clear()
    settings.REGISTRY = {**settings.REGISTRY, "LOOKUP_THROTTLE": "2/minute"}
    body = {"bundle": published.pk, "target": TARGET, "queries": []}
    assert [lookup(api, body).status_code for _ in range(3)] == [200, 200, 429]
    settings.REGISTRY = {**settings.REGISTRY, "LOOKUP_THROTTLE": None}
    assert lookup(api, body).status_code == 200
    cache.clear()
