"""POST /api/v1/lookup has one door (registry.lookup.http.lookup): every request answers alike.

Issue 12: a request with a cookie, a token, or none, and bodies that orjson reads otherwise
than json, all go through the same reading, the same check (moetables.lookup.queries) and the
same mapping of errors to statuses; the body and headers do not depend on how it came.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import pytest
from django.core.cache import cache

from registry.bundles.services import publish_bundle
from registry.lookup import services as lookup_service

if TYPE_CHECKING:
    from rest_framework.test import APIClient

    from registry.bundles.models import Bundle

pytestmark = pytest.mark.django_db

TARGET = {"tp": 1, "dp": 2, "rank": 0, "sequence_parallel": False}
QUERIES: list[Any] = [
    {"component": "gate_routing", "tokens": 1},
    {"component": "gate_routing", "tokens": 5},
    {"component": "finalize_copy", "mode": "graph", "tokens": 64},
    {"component": "experts", "tokens": 6, "activated_experts": 4, "local_assignments": 24},
    {"component": "experts", "tokens": 5, "activated_experts": 6, "local_assignments": 20},
    {"component": "experts", "tokens": 1, "activated_experts": 0, "local_assignments": 0},
    {"component": "experts", "tokens": 5, "activated_experts": 6, "local_assignments": 19},
    {"component": "experts", "tokens": 1, "activated_experts": 9, "local_assignments": 1},
    {"component": "experts", "tokens": 3.0, "activated_experts": 6, "local_assignments": 12},
    {"component": "experts", "tokens": 3, "activated_experts": 6},
    {"component": "gate_routing", "tokens": 10**20},
    {"component": "gate_routing", "tokens": 4, "activated_experts": 10**20},
    {"component": "gate_routing", "tokens": True},
    {"component": ["experts"], "tokens": 1},
    {"component": "no_such_component", "tokens": 1},
    7,
    "x",
]
# Headers a client could see; the rest (Date, Server) belong to the server, not the view.
HEADERS = (
    "Content-Type",
    "Allow",
    "Vary",
    "Set-Cookie",
    "X-Frame-Options",
    "X-Content-Type-Options",
    "Referrer-Policy",
    "Cross-Origin-Opener-Policy",
    "WWW-Authenticate",
    "Retry-After",
)


def _post(client: APIClient, body: bytes, **extra: Any) -> tuple[int, Any, dict[str, Any]]:
    response = client.post("/api/v1/lookup", body, content_type="application/json", **extra)
    try:
        parsed = json.loads(response.content) if response.content else None
    except ValueError:
        parsed = response.content
    return response.status_code, parsed, {h: response.headers.get(h) for h in HEADERS}


def _three_ways(api: APIClient, uploader: APIClient, body: bytes) -> list[Any]:
    """The response without credentials, with a cookie, and with a token."""
    plain = _post(api, body)
    api.cookies["simulator"] = "1"
    try:
        cookie = _post(api, body)
    finally:
        del api.cookies["simulator"]
    token = _post(uploader, body)
    return [plain, cookie, token]


BODIES = [
    {"bundle": None, "target": TARGET, "queries": QUERIES},
    {"bundle": None, "target": TARGET, "queries": [QUERIES[0]] * 3},
    {"bundle": None, "target": TARGET, "queries": []},
    {"bundle": None, "target": {**TARGET, "dp": 1}, "queries": QUERIES[:1]},
    {"bundle": None, "target": {**TARGET, "rank": 2}},
    {
        "hardware": "RTXPRO6000",
        "model": "Qwen/Qwen3-30B-A3B-Instruct-2507",
        "variant": "bf16",
        "target": TARGET,
        "queries": QUERIES[:4],
    },
    {"hardware": "X", "model": "Y", "variant": "Z", "target": TARGET},
    {"sha256": "0" * 64, "target": TARGET},
    [],
]


@pytest.mark.parametrize("index", range(len(BODIES)))
def test_every_way_answers_alike(
    api: APIClient, uploader: APIClient, published: Bundle, index: int
) -> None:
    body = dict(BODIES[index]) if isinstance(BODIES[index], dict) else BODIES[index]
    if isinstance(body, dict) and "bundle" in body:
        body["bundle"] = published.pk
    fast, view, drf = _three_ways(api, uploader, json.dumps(body).encode())
    assert fast == view == drf
    assert fast[2]["Allow"] == "POST, OPTIONS" and fast[2]["X-Frame-Options"] == "DENY"


@pytest.mark.parametrize(
    ("raw", "status"),
    [
        (b"{not json", 400),
        (b"[" * 5000 + b"]" * 5000, 400),
        (b"", 400),
        (b'{"bundle": 1, "target": {"tp": 1, "dp": NaN, "rank": 0}}', 400),
        (b'{"bundle": 1, "target": {"tp": 1, "dp": 1e400, "rank": 0}}', 400),
        (
            b'{"hardware": "RTXPRO6000", "model": "Qwen/Qwen3-30B-A3B-Instruct-2507", '
            b'"variant": "bf16", "target": {"tp": 18446744073709551617, "dp": 1, "rank": 0}}',
            422,
        ),
        (b'{"bundle": 1, "target": {"tp": 1, "dp": -9223372036854775809, "rank": 0}}', 400),
        (
            b'{"hardware": "RTXPRO6000", "model": "Qwen/Qwen3-30B-A3B-Instruct-2507", '
            b'"variant": "bf16", "target": {"tp": 1, "dp": 2, "rank": 0}, '
            b'"queries": [{"component": "\\udc00", "tokens": 1}]}',
            200,
        ),
        (b'\xef\xbb\xbf{"bundle": 1}', 400),
        (b'{"bundle": 1, "target": "\xff"}', 400),
        (b"[1, 2,]", 400),
        (b'"just a string"', 400),
        # Once 500s: a bundle id past 64 bits, and a lone surrogate in a bundle's name.
        (b'{"bundle": 9223372036854775808, "target": {"tp": 1, "dp": 1, "rank": 0}}', 400),
        (
            b'{"hardware": "\\udc00", "model": "m", "variant": "v", '
            b'"target": {"tp": 1, "dp": 1, "rank": 0}}',
            400,
        ),
    ],
)
def test_bodies_orjson_reads_otherwise_take_the_json_way(
    api: APIClient, uploader: APIClient, published: Bundle, raw: bytes, status: int
) -> None:
    fast, view, drf = _three_ways(api, uploader, raw)
    assert fast == view == drf
    assert fast[0] == status, fast
    if status == 400:  # the documented shape, whatever the fault (issue 12)
        assert fast[1]["error"] == "invalid" and fast[1]["problems"], fast


def test_big_integers_in_queries_keep_their_digits(
    api: APIClient, uploader: APIClient, published: Bundle
) -> None:
    """orjson would read 2**64 + 1 as a float; json keeps the integer (and its message)."""
    queries = [{"component": "gate_routing", "tokens": 2**64 + 1}]
    body = json.dumps({"bundle": published.pk, "target": TARGET, "queries": queries}).encode()
    fast, view, drf = _three_ways(api, uploader, body)
    assert fast == view == drf
    assert str(2**64 + 1) in fast[1]["answers"][0]["message"]


def test_a_throttle_applies_with_or_without_a_cookie(
    api: APIClient, published: Bundle, settings: Any
) -> None:
    cache.clear()
    settings.REGISTRY = {**settings.REGISTRY, "LOOKUP_THROTTLE": "2/minute"}
    body = json.dumps({"bundle": published.pk, "target": TARGET, "queries": []}).encode()
    codes = [_post(api, body)[0] for _ in range(3)]
    api.cookies["simulator"] = "1"
    codes.append(_post(api, body)[0])
    assert codes == [200, 200, 429, 429]
    cache.clear()


def test_a_new_bundle_of_the_same_name_is_found_at_once(api: APIClient, make_bundle: Any) -> None:
    """Resolutions are reused only while the database is unchanged (SQLite's change stamp)."""
    body = {
        "hardware": "H100",
        "model": "m/x",
        "variant": "bf16",
        "target": {"tp": 1, "dp": 1, "rank": 0},
        "queries": [{"component": "gate_routing", "tokens": 1}],
    }
    raw = json.dumps(body).encode()
    first = publish_bundle(make_bundle(hardware="H100", model="m/x", scale=1.0)).bundle
    assert [_post(api, raw)[1]["bundle"]["id"] for _ in range(2)] == [first.pk, first.pk]
    second = publish_bundle(make_bundle(hardware="H100", model="m/x", scale=2.0)).bundle
    assert _post(api, raw)[1]["bundle"]["id"] == second.pk
    second.delete()
    assert _post(api, raw)[1]["bundle"]["id"] == first.pk
    by_id = json.dumps(
        {**body, "hardware": None, "model": None, "variant": None, "bundle": first.pk}
    ).encode()
    assert _post(api, by_id)[0] == 200
    first.delete()
    assert _post(api, by_id)[0] == 404
    assert _post(api, raw)[0] == 404


@pytest.mark.django_db(transaction=True)
def test_a_bundle_published_by_another_connection_is_found(
    api: APIClient, make_bundle: Any
) -> None:
    """Another thread (another connection, as another process would be) publishes."""
    import threading

    from django.db import connection

    body = {
        "hardware": "H200",
        "model": "m/y",
        "variant": "bf16",
        "target": {"tp": 1, "dp": 1, "rank": 0},
        "queries": [{"component": "gate_routing", "tokens": 1}],
    }
    raw = json.dumps(body).encode()
    first = publish_bundle(make_bundle(hardware="H200", model="m/y", scale=1.0)).bundle
    assert _post(api, raw)[1]["bundle"]["id"] == first.pk
    folder = make_bundle(hardware="H200", model="m/y", scale=3.0)
    found: list[Any] = []

    def publish() -> None:
        try:
            found.append(publish_bundle(folder).bundle)
        finally:
            connection.close()

    worker = threading.Thread(target=publish)
    worker.start()
    worker.join()
    assert _post(api, raw)[1]["bundle"]["id"] == found[0].pk


def test_the_resolution_memo_stays_bounded(
    api: APIClient, published: Bundle, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(lookup_service, "RESOLVED_LIMIT", 3)
    for n in range(10):
        body = {"sha256": f"{n:064x}", "target": TARGET}
        assert _post(api, json.dumps(body).encode())[0] == 404
    memo = lookup_service._resolved.__dict__.get("found")
    assert memo is None or len(memo) <= 3


def test_a_bad_token_is_refused_and_other_methods_are_not_allowed(
    api: APIClient, published: Bundle
) -> None:
    body = json.dumps({"bundle": published.pk, "target": TARGET, "queries": []}).encode()
    status, answer, headers = _post(api, body, HTTP_AUTHORIZATION="Token not-a-token")
    assert (status, headers["WWW-Authenticate"]) == (401, "Token")
    assert "token" in answer["detail"].lower()
    response = api.get("/api/v1/lookup")
    assert response.status_code == 405 and response["Allow"] == "POST, OPTIONS"
    response = api.post(
        "/api/v1/lookup", "bundle=1", content_type="application/x-www-form-urlencoded"
    )
    assert response.status_code == 400 and "application/json" in response.json()["problems"][0]
