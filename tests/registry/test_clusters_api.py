"""GET /api/v1/clusters/[<name>/]: the shipped cluster descriptions the estimate takes by name
(R45: links come from a cluster description, never from a bundle)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import yaml

from moetables.comm import load_cluster

if TYPE_CHECKING:
    from rest_framework.test import APIClient

pytestmark = pytest.mark.django_db

REPO = Path(__file__).resolve().parents[2]
SHIPPED = REPO / "clusters" / "h200x2-nvlink.yaml"


@pytest.fixture
def clusters(settings: Any, tmp_path: Path) -> Path:
    folder = tmp_path / "clusters"
    folder.mkdir()
    shutil.copy(SHIPPED, folder / SHIPPED.name)
    settings.REGISTRY = {**settings.REGISTRY, "CLUSTER_DIR": str(folder)}
    return folder


def test_it_lists_the_shipped_clusters(api: APIClient) -> None:
    """The repository's own clusters/ folder, as the estimate reads it."""
    response = api.get("/api/v1/clusters/")
    assert response.status_code == 200
    body = response.json()
    shipped = sorted(p.stem for p in (REPO / "clusters").glob("*.yaml"))
    assert [c["name"] for c in body["results"]] == shipped and body["count"] == len(shipped)
    first = next(c for c in body["results"] if c["name"] == "h200x2-nvlink")
    loaded = load_cluster(SHIPPED)
    assert first["ranks"] == sorted(loaded.ranks()) == [0, 1]
    assert first["link_classes"] == ["nvlink"]
    assert first["groups"] == [{"link": "nvlink", "ranks": [0, 1]}]
    assert first["version"] == 2 and first["error"] is None
    assert first["provenance"]["measured_at"] == "2026-11-30"
    assert first["url"].endswith("/api/v1/clusters/h200x2-nvlink")


def test_it_shows_one_cluster_with_its_whole_description(api: APIClient, clusters: Path) -> None:
    import hashlib

    response = api.get("/api/v1/clusters/h200x2-nvlink/")
    assert response.status_code == 200
    body = response.json()
    assert body["document"] == yaml.safe_load(SHIPPED.read_text("utf-8"))
    assert body["sha256"] == hashlib.sha256(SHIPPED.read_bytes()).hexdigest()
    # Without the trailing slash too, as every API v1 route.
    assert api.get("/api/v1/clusters/h200x2-nvlink").json()["name"] == "h200x2-nvlink"


def test_an_unknown_name_is_a_404_naming_the_known_ones(api: APIClient, clusters: Path) -> None:
    response = api.get("/api/v1/clusters/h100x8/")
    assert response.status_code == 404
    body = response.json()
    assert body["error"] == "not_found" and "'h100x8'" in body["message"]
    assert "h200x2-nvlink" in body["message"]


def test_a_file_that_does_not_validate_is_listed_with_its_error(
    api: APIClient, clusters: Path
) -> None:
    raw = yaml.safe_load(SHIPPED.read_text("utf-8"))
    raw["link_classes"]["nvlink"]["collectives"]["all_gather"]["bus_bandwidth_GBps"] = 0
    (clusters / "broken.yaml").write_text(yaml.safe_dump(raw), "utf-8")
    listed = {c["name"]: c for c in api.get("/api/v1/clusters/").json()["results"]}
    assert listed["h200x2-nvlink"]["error"] is None
    assert "bus_bandwidth_GBps" in listed["broken"]["error"]
    response = api.get("/api/v1/clusters/broken/")
    assert response.status_code == 503
    assert response.json()["error"] == "invalid_cluster"
    assert "clusters/broken.yaml" in response.json()["message"]


def test_it_is_read_only(api: APIClient, clusters: Path) -> None:
    assert api.post("/api/v1/clusters/", {}, format="json").status_code == 405
    assert api.delete("/api/v1/clusters/h200x2-nvlink/").status_code == 405


def test_the_schema_documents_both_routes(api: APIClient) -> None:
    schema = api.get("/api/schema/", headers={"accept": "application/vnd.oai.openapi+json"}).json()
    paths = {p.rstrip("/"): v for p, v in schema["paths"].items()}
    listing = paths["/api/v1/clusters"]["get"]
    detail = paths["/api/v1/clusters/{name}"]["get"]
    assert {"200", "404", "503"} <= set(detail["responses"])
    assert listing["tags"] == ["clusters"]
    assert "ClusterDetail" in schema["components"]["schemas"]


def test_the_api_root_names_it(api: APIClient) -> None:
    assert api.get("/api/v1/").json()["clusters"].endswith("/api/v1/clusters")
