"""GET /api/v1/bundles/ and /api/v1/bundles/{id}/: filters, ordering, pagination, details."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import pytest
from rest_framework.request import Request
from rest_framework.test import APIRequestFactory

from registry.bundles.api.serializers import BundleSerializer
from registry.bundles.models import Bundle
from registry.bundles.services import publish_bundle

if TYPE_CHECKING:
    from rest_framework.test import APIClient

pytestmark = pytest.mark.django_db


@pytest.fixture
def catalogue(published: Bundle, make_bundle: Any) -> dict[str, Bundle]:
    """The shipped bundle plus synthetic ones that differ in one indexed field each."""
    made = {
        "h100": make_bundle(hardware="H100", model="synthetic/a", dp=2, backend="DEEPGEMM"),
        "tp2": make_bundle(hardware="H100", model="synthetic/b", tp=2, dp=2, experts=16),
        "old": make_bundle(hardware="A100", model="synthetic/a", vllm_version="0.20.0"),
    }
    bundles = {name: publish_bundle(path).bundle for name, path in made.items()}
    bundles["shipped"] = published
    return bundles


def ids(response: Any) -> set[int]:
    return {row["id"] for row in response.json()["results"]}


def test_it_lists_bundles_anonymously_newest_first(
    api: APIClient,
    catalogue: dict[str, Bundle],
) -> None:
    response = api.get("/api/v1/bundles/")
    assert response.status_code == 200
    body = response.json()
    assert body["count"] == 4
    rows = body["results"]
    assert [r["id"] for r in rows] == sorted((b.pk for b in catalogue.values()), reverse=True)
    shipped = next(r for r in rows if r["id"] == catalogue["shipped"].pk)
    assert shipped["sha256"] == catalogue["shipped"].sha256
    assert shipped["download_url"].endswith(f"/api/v1/bundles/{shipped['id']}/download")
    assert [t["deployment"] for t in shipped["tables"]] == [
        "tp1 dp2_ep2_rank0_sp0",
        "tp1 dp2_ep2_rank1_sp0",
    ]
    assert "meta" not in shipped and "manifest" not in shipped


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("hardware=H100", {"h100", "tp2"}),
        ("model=Qwen/Qwen3-30B-A3B-Instruct-2507", {"shipped"}),
        ("variant=bf16", {"h100", "tp2", "old", "shipped"}),
        ("tp=2", {"tp2"}),
        ("dp=2", {"h100", "tp2", "shipped"}),
        ("ep=4", {"tp2"}),
        ("ep=1", {"old"}),
        ("tp=1&dp=2", {"h100", "shipped"}),
        ("tp=2&dp=1", set()),
        ("vllm_version=0.20.0", {"old"}),
        ("vllm_version=0.28.0", {"shipped"}),
        # Issue 13: current-layout bundles carry their vLLM version (from their contracts),
        # and adapters (backend) and kernels are two filters.
        ("vllm_version=0.26.0", {"h100", "tp2"}),
        ("kernel=DEEPGEMM", {"h100"}),
        ("kernel=TRITON", {"tp2", "old", "shipped"}),
        ("backend=vllm-modular", {"h100", "tp2", "old", "shipped"}),
        ("backend=TRITON", set()),
        ("q=deepgemm", {"h100"}),
        ("q=vllm-modular", {"h100", "tp2", "old", "shipped"}),
        ("layout=historical", {"shipped"}),
        ("q=qwen", {"shipped"}),
        ("hardware=H100&model=synthetic/b", {"tp2"}),
    ],
)
def test_it_filters(
    api: APIClient,
    catalogue: dict[str, Bundle],
    query: str,
    expected: set[str],
) -> None:
    response = api.get(f"/api/v1/bundles/?{query}")
    assert response.status_code == 200
    assert ids(response) == {catalogue[name].pk for name in expected}


def test_it_lists_exactly_what_the_bundle_serializer_describes(
    api: APIClient,
    catalogue: dict[str, Bundle],
) -> None:
    """The list is built by hand for speed; it must equal the documented serializer."""
    listed = api.get("/api/v1/bundles/").json()["results"]
    request = Request(APIRequestFactory().get("/api/v1/bundles/"))
    bundles = Bundle.objects.order_by("-published_at", "-id").prefetch_related("tables")
    described = BundleSerializer(bundles, many=True, context={"request": request}).data
    assert listed == json.loads(json.dumps(described))


def test_it_refuses_a_malformed_filter(api: APIClient, catalogue: dict[str, Bundle]) -> None:
    response = api.get("/api/v1/bundles/?tp=two")
    assert response.status_code == 400
    assert "tp" in response.json()


def test_it_orders_and_paginates(api: APIClient, catalogue: dict[str, Bundle]) -> None:
    response = api.get("/api/v1/bundles/?ordering=hardware,id&limit=2")
    body = response.json()
    assert [r["hardware"] for r in body["results"]] == ["A100", "H100"]
    assert body["next"] is not None and "offset=2" in body["next"]
    rest = api.get(body["next"]).json()
    assert [r["hardware"] for r in rest["results"]] == ["H100", "RTXPRO6000"]
    assert rest["next"] is None


def test_it_caps_the_page_size(api: APIClient, catalogue: dict[str, Bundle]) -> None:
    assert len(api.get("/api/v1/bundles/?limit=100000").json()["results"]) == 4


def test_it_shows_a_bundle_with_its_tables_files_and_metadata(
    api: APIClient,
    published: Bundle,
) -> None:
    response = api.get(f"/api/v1/bundles/{published.pk}/")
    assert response.status_code == 200
    body = response.json()
    assert body["sha256"] == published.sha256
    assert body["missing_files"] == ["tp1/skew_fit.csv", "tp2/skew_fit.csv"]
    assert body["meta"]["hardware"] == "RTXPRO6000"
    assert len(body["files"]) == 8
    assert all(f["url"].startswith("http://testserver/api/v1/bundles/") for f in body["files"])
    table = body["tables"][0]
    assert table["target"] == {"tp": 1, "dp": 2, "ep": 2, "rank": 0, "sequence_parallel": False}
    assert table["support"] == {
        "tokens": [1, 4096],
        "activated_experts": [0, 64],
        "local_assignments": [0, 16384],
        "local_tokens": [1, 2048],
    }
    assert table["contract"]["expert_region"]["backend"] == table["kernel"] == "TRITON"
    assert (table["backend"], table["native"], table["vllm_version"]) == (
        "vllm-modular",
        True,
        "0.28.0",
    )
    assert table["coverage"]["complete"] is True
    assert table["url"].endswith(table["table_path"])
    # Without the trailing slash too, as the issue spells the routes.
    assert api.get(f"/api/v1/bundles/{published.pk}").status_code == 200


def test_it_answers_404_for_an_unknown_bundle(api: APIClient, db: None) -> None:
    assert api.get("/api/v1/bundles/999/").status_code == 404
    assert api.get("/api/v1/bundles/abc/").status_code == 404


def test_it_does_not_allow_changes_over_the_api(uploader: APIClient, published: Bundle) -> None:
    for method in (uploader.put, uploader.patch, uploader.delete):
        assert method(f"/api/v1/bundles/{published.pk}/").status_code == 405
