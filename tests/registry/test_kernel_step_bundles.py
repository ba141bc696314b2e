"""The registry imports the shipped Qwen3-30B-A3B bf16 kernel-step bundles (issue 20, item 1:
`H200-vllm-modular-f2k`, `H200-vllm-live-f2k`) as the run command does, shows them on the
dashboard, and answers their lookups as moetables does."""

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
QWEN = "Qwen/Qwen3-30B-A3B-Instruct-2507"
FOLDERS = {
    kind: REPO / "bundles" / f"H200-vllm-{kind}-f2k" / QWEN / "bf16" for kind in ("modular", "live")
}
TABLES = {"modular": [(1, 1, 0), (1, 2, 0), (1, 2, 1)], "live": [(1, 1, 0)]}


@pytest.fixture
def imported(db: None) -> dict[str, int]:
    """``scripts/run.sh``'s import (``import_bundle bundles`` walks every meta.yaml below it),
    here on the two folders; returns each bundle's key."""
    from registry.bundles.models import Bundle

    out = StringIO()
    call_command("import_bundle", *map(str, FOLDERS.values()), stdout=out, stderr=StringIO())
    text = out.getvalue()
    assert text.count("imported: bundle") == 2, text
    assert "note:" not in text and "left out" not in text
    keys = {}
    for kind in FOLDERS:
        keys[kind] = Bundle.objects.filter(tables__backend=f"vllm-{kind}").distinct().get().pk
    return keys


def test_the_dashboard_lists_both_and_shows_their_tables(
    client: Client, imported: dict[str, int]
) -> None:
    html = client.get("/").content.decode()
    for pk in imported.values():
        assert f'href="/bundles/{pk}/"' in html
    for kind, pk in imported.items():
        page = client.get(f"/bundles/{pk}/")
        assert page.status_code == 200
        from registry.bundles.models import Bundle

        tables = Bundle.objects.get(pk=pk).tables.order_by("dp", "rank")
        assert [(t.tp, t.dp, t.rank) for t in tables] == TABLES[kind]
        for table in tables:
            assert client.get(f"/tables/{table.pk}/").status_code == 200


def test_their_evidence_is_served_from_the_files(api: APIClient, imported: dict[str, int]) -> None:
    """R18 and R26 over REST: B/2B controls at the method's 3 %, conservation traced."""
    from registry.bundles.models import Bundle

    for pk in imported.values():
        for table in Bundle.objects.get(pk=pk).tables.all():
            body = api.get(f"/api/v1/tables/{table.pk}/stability/").json()
            assert body["source"] == "files" and body["quality"]["label"] == "method"
            assert body["summary"]["max_relative_change"] <= 0.03
            conservation = api.get(f"/api/v1/tables/{table.pk}/conservation/")
            assert conservation.status_code == 200


@pytest.mark.parametrize("kind", ["modular", "live"])
def test_a_lookup_at_a_kernel_switch_answers_as_moetables(
    api: APIClient, imported: dict[str, int], kind: str
) -> None:
    """The kernel-step rows (N = 384 and 385 straddle vLLM's switch from the 256 to the 512
    config key) are answered exactly, over REST as in moetables."""
    queries = [
        {"component": "experts", "tokens": n, "activated_experts": a, "local_assignments": 8 * n}
        for n in (384, 385, 777)
        for a in (8, 128)
    ]
    target = {"tp": 1, "dp": 1, "rank": 0, "sequence_parallel": False}
    response = api.post(
        "/api/v1/lookup",
        json.dumps({"bundle": imported[kind], "target": target, "queries": queries}),
        content_type="application/json",
    )
    assert response.status_code == 200, response.content
    expected = ComponentTables(FOLDERS[kind]).deployment(1, 1, 0).answer(queries)
    assert response.json()["answers"] == json.loads(json.dumps(expected))
    answers = response.json()["answers"]
    # A = 8 at N = 384 runs 32-row blocks (12 row tiles per expert), at 385 64-row blocks (7):
    # the measured step, not an interpolation across it.
    assert answers[0]["time_us"] > 1.4 * answers[2]["time_us"]


@pytest.mark.parametrize("kind", ["modular", "live"])
def test_segment_aware_lookups_over_rest_equal_moetables_bit_for_bit(
    api: APIClient, imported: dict[str, int], kind: str
) -> None:
    """The kernel-segment-aware lookup (one triangulation per kernel segment in N) is the one
    door: REST answers equal in-process ones bit for bit, next to every switch of the DP1 table
    and at A the switch rows do not carry, refusals and their messages included (R40, R43)."""
    import numpy as np

    local = ComponentTables(FOLDERS[kind]).deployment(1, 1, 0)
    switches = local.kernel_switches
    assert switches is not None
    rng = np.random.default_rng(11)
    queries: list[dict[str, object]] = []
    for t in switches.switches(2048):
        for n in (t - 1, t, t + 1, t + 2):
            for a in (8, 24, 40, 100, int(rng.integers(8, 129))):
                queries.append(
                    {
                        "component": "experts",
                        "tokens": n,
                        "activated_experts": a,
                        "local_assignments": 8 * n,
                    }
                )
    queries.append(
        {
            "component": "experts",
            "tokens": 4000,
            "activated_experts": 64,
            "local_assignments": 32000,
        }
    )
    queries.append(
        {"component": "experts", "tokens": 3, "activated_experts": 2, "local_assignments": 24}
    )
    target = {"tp": 1, "dp": 1, "rank": 0, "sequence_parallel": False}
    response = api.post(
        "/api/v1/lookup",
        json.dumps({"bundle": imported[kind], "target": target, "queries": queries}),
        content_type="application/json",
    )
    assert response.status_code == 200, response.content
    expected = json.loads(json.dumps(local.answer(queries)))
    answers = response.json()["answers"]
    assert answers == expected
    assert sum("time_us" in x for x in answers) > 0.75 * len(queries)  # small N: A > 8N infeasible
    assert answers[-2]["error"] == "out_of_support" and answers[-1]["error"] == "invalid"
