"""The registry publishes the shipped TP1/DP4/EP4 and TP1/DP8/EP8 H200 bundles (issue 20, item 3)
and answers their layer estimate over REST as moetables does (R44, issue 16's rank tables)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from rest_framework.test import APIClient

from moetables.lookup import ComponentTables
from registry.bundles.services import publish_bundle

pytestmark = [pytest.mark.django_db]

REPO = Path(__file__).resolve().parents[2]
QWEN = "Qwen/Qwen3-30B-A3B-Instruct-2507"
BUNDLES = {dp: REPO / "bundles" / f"H200-vllm-modular-dp{dp}-f4" / QWEN / "bf16" for dp in (4, 8)}
EXPERT_POINTS = {4: 333, 8: 304}


@pytest.fixture
def wide(db: None) -> dict[int, Any]:
    return {dp: publish_bundle(path).bundle for dp, path in BUNDLES.items()}


def test_every_rank_table_is_published_with_its_evidence(
    api: APIClient, wide: dict[int, Any]
) -> None:
    """R18: each rank's table is served with its B/2B points, all passed at the method's 3 %."""
    for dp, bundle in wide.items():
        tables = bundle.tables.order_by("rank")
        assert [(t.tp, t.dp, t.rank) for t in tables] == [(1, dp, r) for r in range(dp)]
        for table in tables:
            body = api.get(f"/api/v1/tables/{table.pk}/stability/").json()
            assert body["source"] == "files" and body["quality"]["label"] == "method"
            assert body["summary"]["published_points"] == EXPERT_POINTS[dp]
            assert body["summary"]["max_relative_change"] <= 0.03


def test_the_estimate_api_answers_at_dp4_and_dp8(api: APIClient, wide: dict[int, Any]) -> None:
    """No cluster: collectives with bytes only, no layer time made up (R44)."""
    for dp in (4, 8):
        for policy in ("balanced", "histogram"):
            tokens = [32 * (i + 1) for i in range(dp)]
            body: dict[str, Any] = {
                "bundle": wide[dp].pk,
                "tp": 1,
                "dp": dp,
                "tokens": tokens,
                "policy": policy,
            }
            options: dict[str, Any] = {}
            if policy == "histogram":
                rng = np.random.default_rng(dp)
                picks = np.argsort(rng.random((sum(tokens), 128)), axis=1)[:, :8]
                options["expert_counts"] = np.bincount(picks.ravel(), minlength=128).tolist()
                body.update(options)
            response = api.post(
                "/api/v1/estimate", json.dumps(body), content_type="application/json"
            )
            assert response.status_code == 200, response.content
            answer = response.json()
            assert answer.pop("bundle")["id"] == wide[dp].pk
            expected = ComponentTables(BUNDLES[dp]).estimate(
                tokens, tp=1, dp=dp, policy=policy, **options
            )
            assert answer == json.loads(json.dumps(expected.as_dict()))
            assert answer["layer_us"] is None and len(answer["ranks"]) == dp
            assert all(c["bytes"] > 0 for c in answer["collectives"])


def test_the_dashboard_shows_every_rank(client: Any, wide: dict[int, Any]) -> None:
    """The bundle page lists the DP8 bundle's eight rank tables; a rank's table page draws."""
    bundle = wide[8]
    html = client.get(f"/bundles/{bundle.pk}/").content.decode()
    for table in bundle.tables.all():
        assert f"/tables/{table.pk}/" in html
    last = bundle.tables.get(rank=7)
    response = client.get(f"/tables/{last.pk}/")
    assert response.status_code == 200
    assert "stability" in response.content.decode().lower()
