"""POST /api/v1/estimate: the layer estimate of moetables over REST (R44, R45)."""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from moetables.cli import main

if TYPE_CHECKING:
    from django.test import Client
    from rest_framework.test import APIClient

pytestmark = pytest.mark.django_db

REPO = Path(__file__).resolve().parents[2]
H200 = REPO / "bundles/H200/Qwen/Qwen3-30B-A3B-Instruct-2507/bf16"
FIXTURE = REPO / "tests/moetables/data/cluster-fixture.yaml"


@pytest.fixture
def h200(db: None) -> Any:
    from registry.bundles.services import publish_bundle

    return publish_bundle(H200).bundle


@pytest.fixture
def clusters(settings: Any, tmp_path: Path) -> Path:
    folder = tmp_path / "clusters"
    folder.mkdir()
    shutil.copy(FIXTURE, folder / "fixture-2x2.yaml")
    settings.REGISTRY = {**settings.REGISTRY, "CLUSTER_DIR": str(folder)}
    return folder


def post(api: APIClient, body: Any) -> Any:
    return api.post("/api/v1/estimate", json.dumps(body), content_type="application/json")


def cli(*args: str) -> Any:
    out = io.StringIO()
    main(["estimate", str(H200), "--tp", "1", "--dp", "2", *args], out=out)
    return json.loads(out.getvalue())


def test_it_answers_as_the_cli_does(api: APIClient, h200: Any, clusters: Path) -> None:
    response = post(
        api,
        {
            "bundle": h200.pk,
            "tp": 1,
            "dp": 2,
            "tokens": [5, 300],
            "policy": "round_robin",
            "cluster": "fixture-2x2",
        },
    )
    assert response.status_code == 200, response.content
    body = response.json()
    answered = body.pop("bundle")  # with what answered it (issue 13.1)
    assert (answered["id"], answered["sha256"], answered["backend"]) == (
        h200.pk,
        h200.sha256,
        "vllm-modular",
    )
    expected = cli("--tokens", "5,300", "--policy", "round_robin", "--cluster", str(FIXTURE))
    assert body == expected
    assert body["layer_us"] > 0 and body["collectives"][0]["transfer_us"] > 0


def test_it_answers_many_steps_each_with_its_own_refusal(api: APIClient, h200: Any) -> None:
    response = post(
        api,
        {
            "hardware": "H200",
            "model": h200.model,
            "variant": h200.variant,
            "tp": 1,
            "dp": 2,
            "steps": [[4, 4], [9000, 3], [100, 7]],
        },
    )
    assert response.status_code == 200, response.content
    answers = response.json()["answers"]
    assert [a.get("error") for a in answers] == [None, "out_of_support", None]
    assert "rank 0 gate_routing" in answers[1]["message"]
    assert answers[2]["layer_us"] is None  # no cluster: no transfer time, never made up
    assert answers[2]["collectives"][0]["bytes"] == 107 * 4096


def test_it_takes_an_inline_cluster_and_names_a_bad_field(api: APIClient, h200: Any) -> None:
    import yaml

    cluster = yaml.safe_load(FIXTURE.read_text())
    ok = post(api, {"bundle": h200.pk, "tp": 1, "dp": 2, "tokens": [8, 8], "cluster": cluster})
    assert ok.status_code == 200 and ok.json()["cluster"] == "fixture-2x2"
    cluster["link_classes"]["fast"]["collectives"]["all_gather"]["bus_bandwidth_GBps"] = -1
    bad = post(api, {"bundle": h200.pk, "tp": 1, "dp": 2, "tokens": [8, 8], "cluster": cluster})
    assert bad.status_code == 400
    assert "all_gather.bus_bandwidth_GBps" in " ".join(bad.json()["problems"])


@pytest.mark.parametrize(
    ("body", "status", "words"),
    [
        ({"tp": 1, "dp": 2, "tokens": [4, 4], "policy": "zipf"}, 400, "unknown routing policy"),
        ({"tp": 1, "dp": 2, "tokens": [4]}, 400, "one token count per DP rank (2)"),
        ({"tp": 1, "dp": 2, "tokens": [4, 4], "cluster": "nowhere"}, 400, "no cluster named"),
        (
            {"tp": 1, "dp": 2, "tokens": [4, 4], "policy": "histogram", "expert_counts": [1] * 128},
            400,
            "add up to 128 pairs but the step has N x k = 8 x 8 = 64",
        ),
        ({"tp": 1, "dp": 2, "tokens": [3000, 1]}, 422, "rank 0 gate_routing at rows=3000"),
        ({"tp": 2, "dp": 2, "tokens": [4, 4]}, 422, "no table for TP2/DP2"),
    ],
)
def test_it_refuses_with_a_status_and_a_reason(
    api: APIClient, h200: Any, clusters: Path, body: dict[str, Any], status: int, words: str
) -> None:
    response = post(api, {"bundle": h200.pk, **body})
    assert response.status_code == status, response.content
    answer = response.json()
    text = answer.get("message") or " ".join(answer["problems"])
    assert words in text


def test_it_bounds_the_steps_of_one_request(api: APIClient, h200: Any) -> None:
    response = post(api, {"bundle": h200.pk, "tp": 1, "dp": 2, "steps": [[1, 1]] * 10_001})
    assert response.status_code == 400
    assert "at most 10000 steps per request" in " ".join(response.json()["problems"])


def test_it_says_when_no_bundle_matches(api: APIClient, db: None) -> None:
    response = post(api, {"bundle": 999, "tp": 1, "dp": 2, "tokens": [4, 4]})
    assert response.status_code == 404


def test_it_is_in_the_openapi_schema(client: Client) -> None:
    response = client.get("/api/schema/", headers={"accept": "application/vnd.oai.openapi+json"})
    operation = response.json()["paths"]["/api/v1/estimate/"]["post"]
    assert operation["operationId"] == "estimate"
    assert set(operation["responses"]) >= {"200", "400", "404", "422"}


def test_it_adds_each_ranks_expert_counts_when_asked(api: APIClient, h200: Any) -> None:
    """R41/R44: `rank_expert_counts` adds each rank's histogram slice (opt-in), as the CLI does;
    a policy without counts is a 400 naming the field."""
    counts = [0] * 128
    for e in (1, 2, 3, 4, 70, 90, 91, 92):
        counts[e] = 5
    body = {
        "bundle": h200.pk,
        "tp": 1,
        "dp": 2,
        "tokens": [2, 3],
        "policy": "histogram",
        "expert_counts": counts,
        "rank_expert_counts": True,
        "events": False,
    }
    response = post(api, body)
    assert response.status_code == 200, response.content
    ranks = response.json()["ranks"]
    assert ranks[0]["expert_counts"] == counts[:64] and ranks[1]["expert_range"] == [64, 128]
    assert ranks[1]["expert_counts"] == counts[64:]
    assert (
        "expert_counts" not in post(api, {**body, "rank_expert_counts": False}).json()["ranks"][0]
    )
    bad = post(
        api, {"bundle": h200.pk, "tp": 1, "dp": 2, "tokens": [2, 3], "rank_expert_counts": True}
    )
    assert bad.status_code == 400
    assert any("rank_expert_counts" in p for p in bad.json()["problems"])


def test_it_charges_row_tiles_over_rest_as_the_cli_does(api: APIClient, h200: Any) -> None:
    """Issue 18: ``tile_cost_us`` over REST answers as ``--tile-cost-us`` does, and names the
    field for a policy without per-expert counts."""
    body = {
        "bundle": h200.pk,
        "tp": 1,
        "dp": 2,
        "tokens": [1024, 1024],
        "policy": "random",
        "seed": 4,
        "tile_cost_us": 1.6,
        "events": False,
    }
    response = post(api, body)
    assert response.status_code == 200, response.content
    answer = response.json()
    answer.pop("bundle")
    assert answer == cli(
        "--tokens",
        "1024,1024",
        "--policy",
        "random",
        "--seed",
        "4",
        "--tile-cost-us",
        "1.6",
        "--no-events",
    )
    plain = post(api, {**body, "tile_cost_us": "none"}).json()
    assert answer["ranks"][0]["components"]["experts"] > plain["ranks"][0]["components"]["experts"]
    refused = post(api, {**body, "policy": "balanced"})
    assert refused.status_code == 400 and "tile_cost_us" in refused.content.decode()


def test_a_seeded_run_asked_in_parts_gets_the_draws_of_one_request(
    api: APIClient, h200: Any
) -> None:
    """R41's seeded policies over REST: step i of a request draws from the stream
    (seed, first_step + i), so a simulator may ask a run in parts."""
    body = {"bundle": h200.pk, "tp": 1, "dp": 2, "policy": "random", "seed": 3, "events": False}
    steps = [[4, 4], [100, 7], [37, 300], [600, 5]]
    whole = post(api, {**body, "steps": steps})
    assert whole.status_code == 200, whole.content
    first = post(api, {**body, "steps": steps[:2]})
    rest = post(api, {**body, "steps": steps[2:], "first_step": 2})
    assert first.json()["answers"] + rest.json()["answers"] == whole.json()["answers"]
    restarted = post(api, {**body, "steps": steps[2:]})
    assert restarted.json()["answers"] != whole.json()["answers"][2:]
    bad = post(api, {**body, "steps": steps, "first_step": -1})
    assert bad.status_code == 400
    assert "first_step: must be at least 0, got -1" in " ".join(bad.json()["problems"])


def test_the_default_load_spread_charge_is_the_in_process_one(api: APIClient, h200: Any) -> None:
    """Issue 18 part 2, session 11: an absent (or null) ``tile_cost_us`` is ``"auto"`` as in
    process, ``"none"`` the balanced-load answer as in process; each differs from the other."""
    from moetables import ComponentTables

    tables = ComponentTables(H200)
    body = {"bundle": h200.pk, "tp": 1, "dp": 2, "tokens": [1024, 1024], "policy": "random",
            "seed": 4, "events": False}  # fmt: skip
    got = {}
    for name, extra in (("absent", {}), ("null", {"tile_cost_us": None}),
                        ("auto", {"tile_cost_us": "auto"}), ("none", {"tile_cost_us": "none"})):  # fmt: skip
        response = post(api, {**body, **extra})
        assert response.status_code == 200, response.content
        got[name] = [r["compute_us"] for r in response.json()["ranks"]]
    default = tables.estimate([1024, 1024], tp=1, dp=2, policy="random", seed=4)
    plain = tables.estimate([1024, 1024], tp=1, dp=2, policy="random", seed=4, tile_cost_us="none")
    assert got["absent"] == got["null"] == got["auto"] == [r.compute_us for r in default.ranks]
    assert got["none"] == [r.compute_us for r in plain.ranks] != got["auto"]
    assert any("charged by default" in n for n in default.notes)
