"""The registry imports the shipped Qwen1.5-MoE and Mixtral H200 bundles (issue 20, items 2, 6)
and the coverage matrix, over REST and on the dashboard, shows both models with every modular
deployment (Mixtral's DP2 rank 1 joined in session 5)."""

from __future__ import annotations

import json
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import call_command
from django.test import Client
from rest_framework.test import APIClient

from moetables.lookup import ComponentTables

pytestmark = [pytest.mark.django_db]

REPO = Path(__file__).resolve().parents[2]
QWEN15 = "Qwen/Qwen1.5-MoE-A2.7B"
MIXTRAL = "mistralai/Mixtral-8x7B-Instruct-v0.1"
FOLDERS = [
    REPO / "bundles" / root / model / "bf16"
    for root in ("H200-vllm-modular-f2", "H200-vllm-live-f2")
    for model in (QWEN15, MIXTRAL)
]


@pytest.fixture
def imported(db: None) -> str:
    out = StringIO()
    call_command("import_bundle", *map(str, FOLDERS), stdout=out, stderr=StringIO())
    return out.getvalue()


def test_the_import_command_publishes_all_four(imported: str) -> None:
    """R38: the run command's import takes them as they are (no refusals, no missing files)."""
    assert imported.count("imported: bundle") == 4
    assert f"H200 {QWEN15} bf16" in imported and f"H200 {MIXTRAL} bf16" in imported
    assert "note:" not in imported and "left out" not in imported


def test_the_coverage_matrix_shows_both_models_and_every_modular_rank(
    api: APIClient, imported: str
) -> None:
    body = api.get("/api/v1/coverage/").json()
    labels = [d["label"] for d in body["deployments"]]
    assert labels == ["tp1 dp1_ep1_rank0_sp0", "tp1 dp2_ep2_rank0_sp0", "tp1 dp2_ep2_rank1_sp0"]
    covered = {
        (r["model"], r["backend"]): [c["table"] is not None for c in r["cells"]]
        for r in body["rows"]
    }
    assert covered == {
        (QWEN15, "vllm-modular"): [True, True, True],
        (QWEN15, "vllm-live"): [True, False, False],
        (MIXTRAL, "vllm-modular"): [True, True, True],  # rank 1 finished in session 5
        (MIXTRAL, "vllm-live"): [True, False, False],
    }
    for r in body["rows"]:
        for c in r["cells"]:
            if c["table"]:
                assert c["quality"]["label"] == "method"


def test_the_dashboard_coverage_page_lists_the_new_models(client: Client, imported: str) -> None:
    html = client.get("/coverage/").content.decode()
    assert 'id="coverage-matrix"' in html
    assert QWEN15 in html and MIXTRAL in html


def test_the_qwen15_live_wrapper_rows_are_looked_up_as_stored(
    api: APIClient, imported: str
) -> None:
    """R26: the wrapper rows (shared expert, its gate, the sum) answer like moetables."""
    from registry.bundles.models import Bundle

    bundle = Bundle.objects.get(model=QWEN15, tables__backend="vllm-live")
    target = {"tp": 1, "dp": 1, "rank": 0, "sequence_parallel": False}
    queries = [{"component": "wrapper", "tokens": n} for n in (1, 256, 300, 2048)]
    response = api.post(
        "/api/v1/lookup",
        json.dumps({"bundle": bundle.pk, "target": target, "queries": queries}),
        content_type="application/json",
    )
    assert response.status_code == 200, response.content
    expected = ComponentTables(FOLDERS[2]).deployment(1, 1, 0).answer(queries)
    assert response.json()["answers"] == json.loads(json.dumps(expected))
    assert response.json()["answers"][0]["time_us"] > 30  # a GEMV pair, a gate, a sum
