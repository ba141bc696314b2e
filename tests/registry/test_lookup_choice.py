"""Issue 13.1: a lookup by hardware + model + variant is answered by the best bundle for the
requested target, pins narrow the choice, unknown keys are refused, and every answer says
what answered it (body and headers)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from moetables.lookup import ComponentTables
from registry.bundles.services import publish_bundle

if TYPE_CHECKING:
    from rest_framework.test import APIClient

    from registry.bundles.models import Bundle

pytestmark = pytest.mark.django_db

ROOT = Path(__file__).resolve().parents[2] / "bundles"
NAME = {"hardware": "H200", "model": "Qwen/Qwen3-30B-A3B-Instruct-2507", "variant": "bf16"}
DP1 = {"tp": 1, "dp": 1, "rank": 0}
DP2 = {"tp": 1, "dp": 2, "rank": 1}
QUERIES = [
    {"component": "gate_routing", "tokens": 8},
    {"component": "experts", "tokens": 16, "activated_experts": 8, "local_assignments": 64},
]


@pytest.fixture
def h200() -> dict[str, Bundle]:
    """The three shipped H200 Qwen3-30B-A3B bf16 bundles, the live one imported last."""
    folders = {
        "modular": ROOT / "H200" / "Qwen/Qwen3-30B-A3B-Instruct-2507/bf16",
        "reference": ROOT / "H200-torch-reference" / "Qwen/Qwen3-30B-A3B-Instruct-2507/bf16",
        "live": ROOT / "H200-vllm-live" / "Qwen/Qwen3-30B-A3B-Instruct-2507/bf16",
    }
    return {name: publish_bundle(path).bundle for name, path in folders.items()}


def post(api: APIClient, body: Any, query: str = "") -> Any:
    return api.post(f"/api/v1/lookup{query}", json.dumps(body), content_type="application/json")


def test_it_picks_a_bundle_that_covers_the_target(api: APIClient, h200: dict[str, Bundle]) -> None:
    """The live bundle (DP1 only) is the latest; a DP2 target is still answered, natively."""
    response = post(api, {**NAME, "target": DP2, "queries": QUERIES})
    assert response.status_code == 200, response.content
    chosen = h200["modular"]
    assert response.json()["bundle"] == {
        "id": chosen.pk,
        "sha256": chosen.sha256,
        "backend": "vllm-modular",
        "kernel": "TRITON",
        "native": True,
        "vllm_version": "0.26.0",
    }
    assert (response["X-Bundle-Id"], response["X-Bundle-Backend"]) == (
        str(chosen.pk),
        "vllm-modular",
    )
    assert response["X-Bundle-Vllm-Version"] == "0.26.0"
    local = ComponentTables(ROOT / "H200" / "Qwen/Qwen3-30B-A3B-Instruct-2507/bf16")
    assert response.json()["answers"] == local.deployment(1, 2, 1).answer(QUERIES)


def test_it_prefers_native_then_newest_vllm_then_newest_measurement(
    api: APIClient, h200: dict[str, Bundle]
) -> None:
    """TP1/DP1: both vLLM bundles are native 0.26.0; the modular one was measured later
    (00:57 against 00:55), so it answers, whichever was imported last."""
    assert h200["modular"].measured_at > h200["live"].measured_at
    response = post(api, {**NAME, "target": DP1, "queries": QUERIES})
    assert response.json()["bundle"]["id"] == h200["modular"].pk
    # the reference bundle answers only when pinned
    response = post(api, {**NAME, "target": DP1, "backend": "torch-reference"})
    assert response.json()["bundle"]["backend"] == "torch-reference"
    assert response.json()["bundle"]["native"] is False
    assert response.json()["bundle"]["vllm_version"] == ""


def test_pins_in_the_body_and_the_query_string(api: APIClient, h200: dict[str, Bundle]) -> None:
    live = post(api, {**NAME, "target": DP1}, "?backend=vllm-live")
    assert live.json()["bundle"]["id"] == h200["live"].pk
    by_sha = post(api, {**NAME, "target": DP1, "bundle": h200["reference"].sha256})
    assert by_sha.json()["bundle"]["id"] == h200["reference"].pk
    by_id = post(api, {**NAME, "target": DP1}, f"?bundle={h200['live'].pk}")
    assert by_id.json()["bundle"]["id"] == h200["live"].pk
    kernel = post(api, {**NAME, "target": DP2, "backend": "TRITON"})
    assert kernel.json()["bundle"]["id"] == h200["modular"].pk
    # the live bundle has no DP2 table: refused, naming what the bundles of that name cover
    refused = post(api, {**NAME, "target": DP2}, "?backend=vllm-live")
    assert refused.status_code == 422
    message = refused.json()["message"]
    assert "backend='vllm-live'" in message and "dp2_ep2_rank1_sp0" in message
    old = post(api, {**NAME, "target": DP1, "vllm_version": "0.20.0"})
    assert old.status_code == 422 and old.json()["error"] == "no_coverage"
    current = post(api, {**NAME, "target": DP2}, "?vllm_version=0.26.0")
    assert current.json()["bundle"]["id"] == h200["modular"].pk


@pytest.mark.parametrize(
    ("body", "query", "fragment"),
    [
        ({**NAME, "target": DP1, "backnd": "vllm-live"}, "", "unknown keys 'backnd'"),
        ({**NAME, "target": {**DP1, "pp": 2}}, "", "target: unknown keys 'pp'"),
        ({**NAME, "target": DP1}, "?bakend=x", "unknown parameter 'bakend'"),
        (
            {**NAME, "target": DP1, "backend": "vllm-live"},
            "?backend=vllm-modular",
            "the body says 'vllm-live' and the query string 'vllm-modular'",
        ),
        ({**NAME, "target": DP1, "backend": ""}, "", "backend: must be a non-empty string"),
        ({**NAME, "hardware": "H2\x0000", "target": DP1}, "", "without NUL characters"),
        ({**NAME, "target": DP1, "bundle": "abc"}, "", "bundle: must be a positive integer"),
    ],
)
def test_it_refuses_unknown_keys_and_contradicting_pins(
    api: APIClient, h200: dict[str, Bundle], body: Any, query: str, fragment: str
) -> None:
    response = post(api, body, query)
    assert response.status_code == 400
    assert response.json()["error"] == "invalid"
    assert any(fragment in p for p in response.json()["problems"]), response.json()


def test_a_named_bundle_must_carry_the_name(api: APIClient, h200: dict[str, Bundle]) -> None:
    other = {**NAME, "hardware": "RTXPRO6000"}
    response = post(api, {**other, "target": DP1, "bundle": h200["live"].pk})
    assert response.status_code == 404


FP8 = "Qwen/Qwen3-30B-A3B-Instruct-2507-FP8"


def test_an_fp8_lookup_by_name_goes_to_the_rule_v4_tables(api: APIClient) -> None:
    """bundles/README.md and the README: with the factor-2 and the rule-v4 FP8 bundles all
    published (the factor-2 ones last), a lookup by name goes to the rule-v4 tables, the newest
    measurement: TP1/DP1 to the live one (measured last), the DP2/EP2 ranks to the modular one."""
    folders = {
        "modular-f2k4": ROOT / "H200-vllm-modular-f2k4",
        "live-f2k4": ROOT / "H200-vllm-live-f2k4",
        "modular-f2": ROOT / "H200-vllm-modular-fp8-f2",
        "live-f2": ROOT / "H200-vllm-live-fp8-f2",
    }
    bundles = {k: publish_bundle(p / FP8 / "fp8").bundle for k, p in folders.items()}
    name = {"hardware": "H200", "model": FP8, "variant": "fp8"}
    chosen = {
        (target["dp"], target["rank"]): post(api, {**name, "target": target, "queries": QUERIES})
        for target in (DP1, DP2)
    }
    assert chosen[(1, 0)].json()["bundle"]["id"] == bundles["live-f2k4"].pk
    assert chosen[(2, 1)].json()["bundle"]["id"] == bundles["modular-f2k4"].pk
    here = ComponentTables(folders["modular-f2k4"] / FP8 / "fp8").deployment(1, 2, 1)
    assert chosen[(2, 1)].json()["answers"] == json.loads(json.dumps(here.answer(QUERIES)))


def test_a_qwen3_235b_rank_lookup_by_name_goes_to_the_rule_v4_ranks(api: APIClient) -> None:
    """bundles/README.md: Qwen3-235B's rule-v4 DP4/EP4 (session 15) and DP8/EP8 (session 16)
    ranks beside its DP1 table are the newest measurements of those targets, so a lookup by
    name goes there even with the factor-4 rank bundles published after them."""
    model = "Qwen/Qwen3-235B-A22B"
    folders = {
        "f2k4": ROOT / "H200-vllm-modular-f2k4",
        "dp4-f4": ROOT / "H200-vllm-modular-dp4-f4",
        "dp8-f4": ROOT / "H200-vllm-modular-dp8-f4",
    }
    bundles = {k: publish_bundle(p / model / "bf16").bundle for k, p in folders.items()}
    name = {"hardware": "H200", "model": model, "variant": "bf16"}
    for dp, rank in ((4, 2), (8, 5)):
        target = {"tp": 1, "dp": dp, "rank": rank}
        got = post(api, {**name, "target": target, "queries": QUERIES})
        assert got.status_code == 200, got.json()
        assert got.json()["bundle"]["id"] == bundles["f2k4"].pk
        here = ComponentTables(folders["f2k4"] / model / "bf16").deployment(1, dp, rank)
        assert got.json()["answers"] == json.loads(json.dumps(here.answer(QUERIES)))
