"""The registry publishes the shipped TP2/DP1/EP2 H200 bundle (issue 20, item 3): both rank tables
with their evidence, in the coverage matrix and on the dashboard, and its TP2 estimate over REST
equals moetables' (R44: the TP all-reduce is a collective, never a table row)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from django.test import Client
from rest_framework.test import APIClient

from moetables.lookup import ComponentTables
from registry.bundles.services import publish_bundle

pytestmark = [pytest.mark.django_db]

REPO = Path(__file__).resolve().parents[2]
TP2 = REPO / "bundles/H200-vllm-modular-tp2-f2/Qwen/Qwen3-30B-A3B-Instruct-2507/bf16"


@pytest.fixture
def tp2(db: None) -> Any:
    return publish_bundle(TP2).bundle


def test_both_rank_tables_are_published_with_their_evidence(api: APIClient, tp2: Any) -> None:
    tables = tp2.tables.order_by("rank")
    assert [(t.tp, t.dp, t.rank) for t in tables] == [(2, 1, 0), (2, 1, 1)]
    for table in tables:
        body = api.get(f"/api/v1/tables/{table.pk}/stability/").json()
        assert body["source"] == "files" and body["quality"]["label"] == "method"
        assert body["summary"]["published_points"] == 559
        assert body["summary"]["max_relative_change"] <= 0.03


def test_the_coverage_matrix_and_dashboard_show_the_tp2_ranks(
    api: APIClient, client: Client, tp2: Any
) -> None:
    body = api.get("/api/v1/coverage/").json()
    labels = [d["label"] for d in body["deployments"]]
    assert labels == ["tp2 dp1_ep2_rank0_sp0", "tp2 dp1_ep2_rank1_sp0"]
    [row] = body["rows"]
    assert [c["table"] is not None for c in row["cells"]] == [True, True]
    html = client.get("/coverage/").content.decode()
    assert "dp1_ep2_rank1_sp0" in html
    page = client.get(f"/bundles/{tp2.pk}/").content.decode()
    for table in tp2.tables.all():
        assert f"/tables/{table.pk}/" in page


def test_the_estimate_api_answers_tp2_dp1_as_moetables_does(api: APIClient, tp2: Any) -> None:
    body = {"bundle": tp2.pk, "tp": 2, "dp": 1, "tokens": [300]}
    response = api.post("/api/v1/estimate", json.dumps(body), content_type="application/json")
    assert response.status_code == 200, response.content
    answer = response.json()
    assert answer.pop("bundle")["id"] == tp2.pk
    expected = ComponentTables(TP2).estimate([300], tp=2, dp=1)
    assert answer == json.loads(json.dumps(expected.as_dict()))
    assert [r["tp_rank"] for r in answer["ranks"]] == [0, 1]
    [reduce] = answer["collectives"]
    assert reduce["op"] == "all_reduce" and reduce["bytes"] == 300 * 2048 * 2
