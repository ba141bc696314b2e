"""POST /api/v1/estimate goes through the lookup's door (registry.lookup.http): the same body
reading, token check, throttle, statuses and answerer headers (issue 11 item 7, issue 13)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from django.core.cache import cache

from registry.bundles.services import publish_bundle

if TYPE_CHECKING:
    from rest_framework.test import APIClient

    from registry.bundles.models import Bundle

pytestmark = pytest.mark.django_db

H200 = Path(__file__).resolve().parents[2] / "bundles/H200/Qwen/Qwen3-30B-A3B-Instruct-2507/bf16"


@pytest.fixture
def published(db: None) -> Bundle:
    return publish_bundle(H200).bundle


def _post(api: APIClient, body: bytes | str, **extra: Any) -> Any:
    return api.post("/api/v1/estimate", body, content_type="application/json", **extra)


def test_it_answers_with_who_answered_in_headers(api: APIClient, published: Bundle) -> None:
    response = _post(
        api, json.dumps({"bundle": published.pk, "tp": 1, "dp": 2, "tokens": [5, 300]})
    )
    assert response.status_code == 200, response.content
    assert response["X-Bundle-Sha256"] == published.sha256 == response.json()["bundle"]["sha256"]
    assert response["X-Bundle-Id"] == str(published.pk)
    assert response["Allow"] == "POST, OPTIONS"


def test_it_reads_the_body_as_the_lookup_does(api: APIClient, published: Bundle) -> None:
    """json's reading where orjson's differs: NaN refused, an integer beyond int64 named."""
    response = _post(api, '{"bundle": 1, "tp": 1, "dp": 2, "tokens": [NaN, 3]}')
    assert response.status_code == 400
    assert "NaN is not a JSON number" in response.json()["problems"][0]
    response = _post(
        api, json.dumps({"bundle": published.pk, "tp": 1, "dp": 2, "tokens": [2**64 + 1, 3]})
    )
    assert response.status_code == 400
    assert str(2**64 + 1) in response.content.decode()
    response = api.post(
        "/api/v1/estimate", "tp=1", content_type="application/x-www-form-urlencoded"
    )
    assert response.status_code == 400 and "application/json" in response.json()["problems"][0]
    assert _post(api, "[" * 5000 + "]" * 5000).status_code == 400


def test_a_bad_token_is_refused_and_other_methods_are_not_allowed(
    api: APIClient, published: Bundle
) -> None:
    body = json.dumps({"bundle": published.pk, "tp": 1, "dp": 2, "tokens": [5, 300]})
    response = _post(api, body, HTTP_AUTHORIZATION="Token not-a-token")
    assert (response.status_code, response["WWW-Authenticate"]) == (401, "Token")
    response = api.get("/api/v1/estimate")
    assert response.status_code == 405 and response["Allow"] == "POST, OPTIONS"
    assert api.options("/api/v1/estimate").json()["name"] == "Estimate"


def test_the_lookup_throttle_counts_estimates_too(
    api: APIClient, published: Bundle, settings: Any
) -> None:
    cache.clear()
    settings.REGISTRY = {**settings.REGISTRY, "LOOKUP_THROTTLE": "2/minute"}
    body = json.dumps({"bundle": published.pk, "tp": 1, "dp": 2, "tokens": [5, 300]})
    codes = [_post(api, body).status_code for _ in range(3)]
    api.cookies["simulator"] = "1"
    codes.append(_post(api, body).status_code)
    assert codes == [200, 200, 429, 429]
    assert int(_post(api, body)["Retry-After"]) >= 1
    cache.clear()
