"""Quality evidence and coverage over the API: stability, conservation, the coverage matrix,
requests for gaps, exploratory bundles in name lookups, jobs waiting for a missing worker."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.utils import timezone
from rest_framework.test import APIClient

from registry.bundles.services import publish_bundle
from registry.models import AcquisitionJob, CoverageRequest, DeploymentTable, WorkerPresence
from registry.services.requests import request_cell, waiting_for_worker

pytestmark = [pytest.mark.django_db]

REPO = Path(__file__).resolve().parents[2]
QWEN = "Qwen/Qwen3-30B-A3B-Instruct-2507"
H200 = {
    name: REPO / "bundles" / name / QWEN / "bf16"
    for name in ("H200", "H200-vllm-live", "H200-torch-reference")
}


@pytest.fixture
def h200(db: None) -> dict[str, Any]:
    return {name: publish_bundle(path).bundle for name, path in H200.items()}


def test_every_h200_table_serves_its_stability_points(api: APIClient, h200: dict[str, Any]) -> None:
    """R18: every published expert point with its B and 2B medians and attempts."""
    for bundle in h200.values():
        for table in bundle.tables.all():
            body = api.get(f"/api/v1/tables/{table.pk}/stability/").json()
            assert body["source"] == "files" and body["absent"] is None
            published = [p for p in body["points"] if p["published"]]
            assert len(published) == body["summary"]["published_points"] > 0
            assert all(p["passed"] and p["b2_sets"] == 2 * p["b_sets"] for p in published)
            assert body["summary"]["max_relative_change"] <= 0.03
            assert body["quality"]["label"] == "method"


def test_it_marks_the_retried_point_of_the_modular_rank_1(
    api: APIClient, h200: dict[str, Any]
) -> None:
    table = h200["H200"].tables.get(dp=2, rank=1)
    body = api.get(f"/api/v1/tables/{table.pk}/stability/").json()
    assert body["summary"]["retried_points"] == 1 and body["summary"]["failed_controls"] == 1
    failed = [p for p in body["points"] if not p["passed"]]
    assert failed[0]["relative_change"] > 0.03 and not failed[0]["published"]


def test_the_live_table_serves_its_traced_forwards(api: APIClient, h200: dict[str, Any]) -> None:
    """R26: components + outside the scopes = the whole native forward, per traced forward."""
    table = h200["H200-vllm-live"].tables.get()
    body = api.get(f"/api/v1/tables/{table.pk}/conservation/").json()
    assert body["absent"] is None and [f["tokens"] for f in body["forwards"]] == [1, 256, 2048]
    for f in body["forwards"]:
        assert abs(f["attributed_us"] + f["outside_scopes_us"] - f["native_total_us"]) < 0.01
    assert body["supplement"] is None  # traced in the table's own build
    modular = h200["H200"].tables.first()
    body = api.get(f"/api/v1/tables/{modular.pk}/conservation/").json()
    if body["supplement"] is None:
        assert body["forwards"] == [] and "traces no native MoE forward" in body["absent"]
    else:
        # Once `python -m acquisition conserve` has run on the H200 (docs/h200-runs.md), the
        # shipped modular tables carry forwards traced separately, and say so.
        assert body["supplement"]["measured"] == "separately from the table"
        assert body["supplement"]["device_name"] == "NVIDIA H200"
        assert [f["tokens"] for f in body["forwards"]] == [1, 256, 2048]


def test_supplementary_forwards_say_when_and_how_they_were_traced(
    api: APIClient, db: None, tmp_path: Path
) -> None:
    """Traces attached after the table (acquisition conserve) carry their provenance to the API
    and the page; the rows here are test values, attached to a copy of a shipped bundle."""
    import shutil

    from moetables.bundle import ConservationRow, attach_conservation, open_bundle

    copy = tmp_path / "H200" / QWEN / "bf16"
    shutil.copytree(H200["H200"], copy)
    traced = {}
    for entry in open_bundle(copy).entries:
        rows = [ConservationRow(0, 1, 30.5, 0.5, {"gate_routing": 10.0, "experts": 20.0})]
        supplement = {
            "measured": "separately from the table",
            "measured_at": "2026-12-01T06:00:00+00:00",
            "table_measured_at": entry.contract["provenance"]["started_at"],
            "command_line": "python -m acquisition conserve TEST",
            "written_by": "python -m acquisition conserve",
            "device_name": "TEST GPU",
            "vllm_version": "0.26.0",
            "torch_version": "test",
            "launch_ownership": [{"tokens": 1}],
        }
        traced[entry.target] = (rows, supplement)
    attach_conservation(copy, traced, replace=True)  # replace: whether or not traced already
    bundle = publish_bundle(copy).bundle
    table = bundle.tables.get(dp=1)
    body = api.get(f"/api/v1/tables/{table.pk}/conservation/").json()
    assert body["absent"] is None and body["forwards"][0]["native_total_us"] == 30.5
    assert body["supplement"]["measured_at"] == "2026-12-01T06:00:00+00:00"
    assert body["supplement"]["command_line"] == "python -m acquisition conserve TEST"
    assert "launch_ownership" not in body["supplement"]  # the detail stays in the bundle
    page = api.get(f"/tables/{table.pk}/").content.decode()
    assert "Traced separately from the table, on 2026-12-01T06:00:00+00:00 (TEST GPU" in page


def test_the_historical_table_uses_its_coverage_controls(api: APIClient, published: Any) -> None:
    table = published.tables.first()
    body = api.get(f"/api/v1/tables/{table.pk}/stability/").json()
    assert body["source"] == "coverage.json" and len(body["points"]) == 426
    body = api.get(f"/api/v1/tables/{table.pk}/conservation/").json()
    assert body["forwards"] == [] and "historical" in body["absent"]


def test_a_format_1_bundle_says_its_evidence_is_absent(api: APIClient, make_bundle: Any) -> None:
    bundle = publish_bundle(make_bundle()).bundle
    body = api.get(f"/api/v1/tables/{bundle.tables.first().pk}/stability/").json()
    assert body["points"] == [] and "format version 1" in body["absent"]


def test_a_missing_table_is_404(api: APIClient, db: None) -> None:
    assert api.get("/api/v1/tables/999999/stability/").status_code == 404
    assert api.get("/api/v1/tables/999999/conservation/").status_code == 404


def test_the_schema_documents_the_new_endpoints(api: APIClient) -> None:
    schema = api.get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json").json()
    for path in (
        "/api/v1/tables/{id}/stability/",
        "/api/v1/tables/{id}/conservation/",
        "/api/v1/coverage/",
    ):
        assert any(p.rstrip("/") == path.rstrip("/") for p in schema["paths"]), path


def test_the_coverage_matrix_links_tables_and_shows_gaps(
    api: APIClient, h200: dict[str, Any]
) -> None:
    body = api.get("/api/v1/coverage/").json()
    labels = [d["label"] for d in body["deployments"]]
    assert labels == ["tp1 dp1_ep1_rank0_sp0", "tp1 dp2_ep2_rank0_sp0", "tp1 dp2_ep2_rank1_sp0"]
    rows = {(r["hardware"], r["backend"]): r for r in body["rows"]}
    assert len(rows) == 3
    live = next(r for r in body["rows"] if r["cells"][0]["table"] and not r["cells"][1]["table"])
    assert live["cells"][1]["table"] is None and body["gaps"] == 2
    covered = live["cells"][0]
    table = DeploymentTable.objects.get(pk=covered["table"])
    assert covered["points"] == table.row_count and covered["url"] == f"/tables/{table.pk}/"
    assert covered["quality"]["label"] == "method"
    # every covered cell names its own table, in its own row and column
    ids = [c["table"] for r in body["rows"] for c in r["cells"] if c["table"]]
    assert len(ids) == len(set(ids)) == 7
    for r in body["rows"]:
        for c in r["cells"]:
            if c["table"]:
                t = DeploymentTable.objects.select_related("bundle").get(pk=c["table"])
                assert (t.backend, t.dp, t.rank) == (r["backend"], c["dp"], c["rank"])


def _user(name: str) -> Any:
    return get_user_model().objects.create_user(name, password="x")


DP4 = REPO / "bundles" / "H200-vllm-modular-dp4-f4" / QWEN / "bf16"


@pytest.fixture
def gap(h200: dict[str, Any]) -> dict[str, Any]:
    """A gap its backend can measure: with the modular DP4 tables published, the torch
    reference row lacks DP4 (the live row's DP2 and DP4 gaps are not measurable, R25)."""
    publish_bundle(DP4)
    return {
        "hardware": "H200",
        "model": QWEN,
        "variant": "bf16",
        "backend": "torch-reference",
        "tp": 1,
        "dp": 4,
        "rank": 0,
        "sequence_parallel": False,
    }


def _live_dp2(h200: dict[str, Any]) -> dict[str, Any]:
    table = h200["H200-vllm-live"].tables.get()
    return {
        "hardware": "H200",
        "model": QWEN,
        "variant": "bf16",
        "backend": table.backend,
        "tp": 1,
        "dp": 2,
        "rank": 0,
        "sequence_parallel": False,
    }


def test_a_request_without_a_worker_stays_open_and_is_deduplicated(
    api: APIClient, gap: dict[str, Any]
) -> None:
    first, created = request_cell(_user("ann"), gap)
    again, joined = request_cell(_user("bob"), gap)
    assert (
        created
        and not joined
        and first.pk == again.pk
        and first.state == "open"
        and first.job is None
    )
    assert first.requesters.count() == 2
    body = api.get("/api/v1/coverage/").json()
    gaps = [c for r in body["rows"] for c in r["cells"] if c["request"]]
    assert len(gaps) == 1 and gaps[0]["request"]["requesters"] == 2
    with pytest.raises(ValueError, match="already has a published table"):
        request_cell(_user("cy"), {**gap, "dp": 1})


def test_a_request_queues_a_job_when_a_worker_is_online(
    gap: dict[str, Any], redis_broker: Any
) -> None:
    WorkerPresence.objects.create(node="gpu@h200", queues=["gpu.H200"], last_seen=timezone.now())
    made, _ = request_cell(_user("ann"), gap)
    assert made.state == "queued" and made.job is not None
    assert made.job.queue == "gpu.H200" and made.job.parameters["dp"] == [4]
    assert made.job.parameters["backend"] == "torch-reference"


def test_publishing_the_cell_closes_its_request(h200: dict[str, Any], make_bundle: Any) -> None:
    gap = {
        "hardware": "SYNTH-GPU",
        "model": "synthetic/moe-8e",
        "variant": "bf16",
        "backend": "vllm-modular",  # the execution path (issue 13.1: adapters, not kernels)
        "tp": 1,
        "dp": 2,
        "rank": 1,
        "sequence_parallel": False,
    }
    publish_bundle(make_bundle())  # dp1 only: dp2 is a gap
    # The catalog does not know the synthetic model; record the request as the page would.
    request = CoverageRequest.objects.create(**{**gap, "ep": 2})
    publish_bundle(make_bundle(dp=2))
    request.refresh_from_db()
    assert request.state == "closed" and request.closed_at is not None


def test_a_queued_job_says_when_no_worker_of_its_queue_exists(api: APIClient, db: None) -> None:
    job = AcquisitionJob.objects.create(
        parameters={"model": QWEN, "hardware": "H200"}, queue="gpu.H200"
    )
    assert "no worker of queue gpu.H200 has been seen" in (waiting_for_worker(job) or "")
    body = api.get(f"/api/v1/jobs/{job.pk}/").json()
    assert "no worker of queue gpu.H200 has been seen" in body["waiting_for_worker"]
    WorkerPresence.objects.create(node="gpu@h200", queues=["gpu.H200"], last_seen=timezone.now())
    assert api.get(f"/api/v1/jobs/{job.pk}/").json()["waiting_for_worker"] is None


def test_name_lookups_skip_exploratory_bundles_unless_asked(
    api: APIClient, make_bundle: Any
) -> None:
    older = publish_bundle(make_bundle()).bundle
    newer = publish_bundle(make_bundle(scale=2.0)).bundle
    type(newer).objects.filter(pk=newer.pk).update(exploratory=True)
    body = {
        "hardware": "SYNTH-GPU",
        "model": "synthetic/moe-8e",
        "variant": "bf16",
        "target": {"tp": 1, "dp": 1, "rank": 0},
        "queries": [],
    }
    assert api.post("/api/v1/lookup", body, format="json").json()["bundle"]["id"] == older.pk
    asked = {**body, "include_exploratory": True}
    assert api.post("/api/v1/lookup", asked, format="json").json()["bundle"]["id"] == newer.pk
    listed = api.get(f"/api/v1/bundles/{newer.pk}").json()
    assert listed["exploratory"] is True


def test_the_api_records_a_request_with_a_token(
    api: APIClient, uploader: APIClient, gap: dict[str, Any]
) -> None:
    body = {**gap, "sequence_parallel": False}
    assert api.post("/api/v1/coverage/requests", body, format="json").status_code == 401
    first = uploader.post("/api/v1/coverage/requests", body, format="json")
    assert first.status_code == 201 and first.json()["state"] == "open"
    again = uploader.post("/api/v1/coverage/requests", body, format="json")
    assert again.status_code == 200 and again.json()["id"] == first.json()["id"]
    filled = uploader.post("/api/v1/coverage/requests", {**body, "dp": 1}, format="json")
    assert (
        filled.status_code == 400
        and "already has a published table" in filled.json()["problems"][0]
    )
    listed = api.get("/api/v1/coverage/requests").json()
    assert [r["deployment"] for r in listed] == ["tp1 dp4_ep4_rank0_sp0"]


def test_publication_refuses_evidence_that_does_not_match(db: None, tmp_path: Path) -> None:
    """The registry validates the evidence like the reader: a changed stability.csv is refused."""
    import shutil

    from registry.bundles.services import PublishError

    copy = tmp_path / "bf16"
    shutil.copytree(H200["H200-vllm-live"], copy)
    path = next(copy.rglob("stability.csv"))
    path.write_bytes(path.read_bytes().replace(b",0.03,1,1\n", b",0.03,1,0\n", 1))
    with pytest.raises(PublishError) as caught:
        publish_bundle(copy)
    assert "stability.csv" in " ".join(caught.value.problems)


def test_a_queue_is_online_only_while_its_workers_stamp_it(db: None) -> None:
    from datetime import timedelta

    from registry.services.requests import queue_online, record_presence

    assert not queue_online("gpu.H200")
    record_presence("gpu0@host", ["gpu.H200"])
    assert queue_online("gpu.H200") and not queue_online("gpu.B200")
    WorkerPresence.objects.update(last_seen=timezone.now() - timedelta(minutes=5))
    assert not queue_online("gpu.H200")


def test_a_user_who_may_not_queue_jobs_may_not_request(gap: dict[str, Any]) -> None:
    """registry.permissions.can_queue_job decides, as for a job (an inactive account may not)."""
    from registry.permissions import NotAllowed

    user = _user("gone")
    user.is_active = False
    user.save()
    with pytest.raises(NotAllowed):
        request_cell(user, gap)
    assert not CoverageRequest.objects.exists()


def test_the_matrix_says_which_gaps_their_backend_cannot_measure(
    api: APIClient, gap: dict[str, Any]
) -> None:
    """R25: the live path measures TP1/DP1/EP1 only, so its DP2 and DP4 gaps are not
    requestable and say why; the torch reference's DP4 gaps are."""
    body = api.get("/api/v1/coverage/").json()
    rows = {r["backend"]: r for r in body["rows"]}
    live_gaps = [c for c in rows["vllm-live"]["cells"] if c["table"] is None]
    assert [c["dp"] for c in live_gaps] == [2, 2, 4, 4, 4, 4]
    for c in live_gaps:
        assert c["not_measurable"].startswith("not measurable by vllm-live: target TP1/DP")
        assert "TP1/DP1/EP1 only (R25)" in c["not_measurable"]
        assert c["reason"] == 1
    # one reason for the six cells, said once for the row, without any cell's deployment
    assert rows["vllm-live"]["reasons"] == [
        "not measurable by vllm-live: the live path measures the engine's layer at "
        "TP1/DP1/EP1 only (R25)"
    ]
    reference_gaps = [c for c in rows["torch-reference"]["cells"] if c["table"] is None]
    assert [c["dp"] for c in reference_gaps] == [4, 4, 4, 4]
    assert all(c["not_measurable"] is None and c["reason"] is None for c in reference_gaps)
    assert rows["torch-reference"]["reasons"] == []
    assert all(c["not_measurable"] is None for r in body["rows"] for c in r["cells"] if c["table"])


def test_a_request_for_a_cell_its_backend_cannot_measure_is_refused(
    api: APIClient, uploader: APIClient, h200: dict[str, Any], redis_broker: Any
) -> None:
    """Neither the service nor the API records (or queues) a request no job could fill."""
    from registry.services.requests import NotMeasurable

    WorkerPresence.objects.create(node="gpu@h200", queues=["gpu.H200"], last_seen=timezone.now())
    with pytest.raises(NotMeasurable, match=r"not measurable by vllm-live: .*TP1/DP1/EP1 only"):
        request_cell(_user("ann"), _live_dp2(h200))
    answer = uploader.post("/api/v1/coverage/requests", _live_dp2(h200), format="json")
    assert answer.status_code == 400
    assert answer.json()["error"] == "not_measurable"
    assert "not measurable by vllm-live" in answer.json()["message"]
    assert "R25" in answer.json()["problems"][0]
    assert not CoverageRequest.objects.exists() and not AcquisitionJob.objects.exists()


def test_a_request_for_a_backend_the_acquisition_does_not_run_is_refused(
    h200: dict[str, Any],
) -> None:
    from registry.services.requests import NotMeasurable

    cell = {**_live_dp2(h200), "dp": 1, "backend": "triton"}
    with pytest.raises(NotMeasurable, match="'triton' is not a backend this acquisition runs"):
        request_cell(_user("ann"), cell)
