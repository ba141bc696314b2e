"""The OpenAPI schema, Swagger UI without any network, the landing page, the API root."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from django.test import Client

    from registry.bundles.models import Bundle

pytestmark = pytest.mark.django_db


def test_it_serves_an_openapi_schema_of_every_endpoint(client: Client) -> None:
    response = client.get("/api/schema/", headers={"accept": "application/vnd.oai.openapi+json"})
    assert response.status_code == 200
    schema = response.json()
    assert schema["openapi"].startswith("3.")
    paths = schema["paths"]
    for path in (
        "/api/v1/bundles",
        "/api/v1/bundles/{id}",
        "/api/v1/bundles/{id}/download",
        "/api/v1/bundles/{id}/files/{path}",
        "/api/v1/lookup",
    ):
        assert any(p.rstrip("/") == path for p in paths), (path, sorted(paths))
    upload = next(v for p, v in paths.items() if p.rstrip("/") == "/api/v1/bundles")["post"]
    assert "multipart/form-data" in upload["requestBody"]["content"]
    assert {"200", "201", "400"} <= set(upload["responses"])


def test_it_serves_swagger_ui_from_local_assets(client: Client) -> None:
    response = client.get("/api/docs/")
    assert response.status_code == 200
    html = response.content.decode()
    assets = re.findall(r'(?:src|href)="([^"]+)"', html)
    assert any("swagger-ui" in a for a in assets)
    assert all(not a.startswith(("http://", "https://", "//")) for a in assets), assets
    for asset in (a for a in assets if a.startswith("/static/")):
        assert client.get(asset).status_code == 200, asset


def test_it_shows_the_bundles_on_the_landing_page(client: Client, published: Bundle) -> None:
    response = client.get("/")
    assert response.status_code == 200
    html = response.content.decode()
    assert "1 bundle" in html and "Qwen/Qwen3-30B-A3B-Instruct-2507" in html
    assert f"/api/v1/bundles/{published.pk}/download" in html
    assert "/api/docs/" in html


def test_it_lists_the_api_resources(client: Client) -> None:
    body = client.get("/api/v1/").json()
    assert body["bundles"].endswith("/api/v1/bundles")
    assert body["lookup"].endswith("/api/v1/lookup")
