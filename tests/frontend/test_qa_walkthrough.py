"""Dashboard details met walking the README (session 6 QA)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from django.test import Client

REPO = Path(__file__).resolve().parents[2]
H200 = REPO / "bundles/H200/Qwen/Qwen3-30B-A3B-Instruct-2507/bf16"

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize(
    "path",
    [
        "/",
        "/coverage/",
        "/routing-profiles/",
        "/jobs/",
        "/compare/",
        "/accounts/login/",
        "/api/redoc/",
    ],
)
def test_every_page_names_its_icon(client: Client, path: str) -> None:
    """Without a declared icon a browser asks for /favicon.ico, a 404 in the console of every
    page; a data: URL (the CSP allows data: images) costs no request."""
    response = client.get(path)
    assert response.status_code == 200
    icon = re.search(r'<link rel="icon" href="([^"]*)"', response.content.decode())
    assert icon is not None, path
    assert icon.group(1).startswith("data:")


DP4 = REPO / "bundles/H200-vllm-modular-dp4-f4/Qwen/Qwen3-30B-A3B-Instruct-2507/bf16"


def test_the_estimate_page_preselects_only_a_cluster_that_holds_the_deployment(
    client: Client, registry_dirs: Path
) -> None:
    """The shipped cluster is the two-H200 host: preselected on a DP4 bundle's page it turned
    the first Estimate into a refusal; it is offered, not chosen, where it cannot hold the
    ranks, and still chosen where it can."""
    from registry.bundles.services import publish_bundle

    dp4 = publish_bundle(DP4).bundle
    page = client.get(f"/bundles/{dp4.pk}/estimate").content.decode()
    select = re.search(r'<select id="e-cluster".*?</select>', page, re.S)
    assert select is not None
    assert "<option >h200x2-nvlink</option>" in select.group(0)
    assert '<option value="" selected>' in select.group(0)
    answered = client.get(
        f"/bundles/{dp4.pk}/estimate", {"deployment": "1/4/0", "tokens": "64,64,64,64"}
    ).content.decode()
    assert "Refused" not in answered and "with transfers left out" in answered
    dp2 = publish_bundle(H200).bundle
    page = client.get(f"/bundles/{dp2.pk}/estimate").content.decode()
    assert "<option selected>h200x2-nvlink</option>" in page


def test_a_cluster_refusal_names_the_shipped_file_not_the_servers_path(
    client: Client, registry_dirs: Path
) -> None:
    from registry.bundles.services import publish_bundle

    dp4 = publish_bundle(DP4).bundle
    body = {"bundle": dp4.pk, "tp": 1, "dp": 4, "tokens": [5, 5, 5, 5], "cluster": "h200x2-nvlink"}
    response = client.post("/api/v1/estimate", json.dumps(body), content_type="application/json")
    assert response.status_code == 400
    (problem,) = response.json()["problems"]
    assert problem.startswith("cluster 'h200x2-nvlink' (clusters/h200x2-nvlink.yaml) puts rank 2")
    assert str(REPO) not in problem


def test_the_estimate_page_offers_the_captured_expectation(
    client: Client, registry_dirs: Path
) -> None:
    """REST and the CLI answer a captured profile's mean per-rank (A, M) (profile_draw
    "expectation", --profile-expectation); the page offered only the seeded draw."""
    from registry.bundles.services import publish_bundle
    from registry.services.profiles import import_profile_file

    bundle = publish_bundle(H200).bundle
    profile = import_profile_file(REPO / "docs/evidence/h200-routing/normal_routing.routing.npz")
    form = client.get(f"/bundles/{bundle.pk}/estimate").content.decode()
    assert '<select id="e-draw" name="profile_draw">' in form
    query = {"deployment": "1/2/0", "tokens": "64,64", "policy": "captured", "layer": "0"}
    query |= {"profile": str(profile.record.pk), "profile_draw": "expectation", "cluster": ""}
    page = client.get(f"/bundles/{bundle.pk}/estimate", query).content.decode()
    body = {"bundle": bundle.pk, "tp": 1, "dp": 2, "tokens": [64, 64], "policy": "captured"}
    body |= {"profile": profile.record.pk, "layer": 0, "profile_draw": "expectation"}
    rest = client.post("/api/v1/estimate", json.dumps(body), content_type="application/json")
    assert rest.status_code == 200, rest.content
    layer = rest.json()["layer_compute_us"]
    assert f"{layer:.2f} µs with transfers left out" in page
    drawn = client.get(f"/bundles/{bundle.pk}/estimate", query | {"profile_draw": "sample"})
    assert f"{layer:.2f} µs with transfers left out" not in drawn.content.decode()


@pytest.mark.parametrize("huge", [str(2**64), str(2**63), "-" + str(2**64)])
def test_compare_answers_an_id_beyond_any_table_with_a_404(client: Client, huge: str) -> None:
    """docs/dashboard.md: an unknown id is a 404; one past 64 bits was a 500 (the database
    cannot hold the number)."""
    assert client.get("/compare/", {"a": huge, "b": "1"}).status_code == 404
    assert client.get("/compare/", {"a": "1", "b": "2", "also": huge}).status_code == 404
