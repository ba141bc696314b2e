"""The jobs API without a worker: validation like the CLI, queueing after commit, the broker
down (503 while reads and lookups still work), cancel and retry rules, redelivery rules."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from config.celery import app
from registry.jobs.runner import claim_job
from registry.jobs.sweep import recover_jobs
from registry.models import AcquisitionJob

pytestmark = [pytest.mark.django_db]

REPO = Path(__file__).resolve().parents[2]
QWEN = "Qwen/Qwen3-30B-A3B-Instruct-2507"


@pytest.fixture
def broker_down() -> Iterator[None]:
    saved = (app.conf.broker_url, app.conf.broker_transport_options)
    app.conf.broker_url = "redis://127.0.0.1:1/0"  # nothing listens on port 1
    app.conf.broker_transport_options = {}
    yield
    app.conf.broker_url, app.conf.broker_transport_options = saved


def _messages(client: Any, queue: str) -> list[dict[str, Any]]:
    return [json.loads(raw) for raw in client.lrange(queue, 0, -1)]


@pytest.mark.parametrize(
    ("params", "field", "words"),
    [
        ({"model": "nobody/no-such-moe"}, "model", "unknown model"),
        ({"dp": [2], "ep": [4]}, "ep", "matches no selected"),
        ({"tp": [2]}, "tp", "must include 1"),
        ({"max_num_seqs": 4096}, "max_num_seqs", "exceeds --max-num-batched-tokens"),
        ({"max_num_batched_tokens": 0}, "max_num_batched_tokens", "positive"),
        ({"grid_factor": 1.0}, "grid_factor", "at least"),
        ({"backend": "magic"}, "backend", "invalid choice"),
        ({"hardware": "H200; rm -rf /"}, "hardware", "letters"),
        ({"model": "/etc"}, "model", "unknown model"),
        ({"rounds": "many"}, "rounds", "integer"),
        ({"surprise": 1}, "surprise", "unknown parameter"),
    ],
)
def test_it_refuses_bad_parameters_with_field_errors(
    uploader: APIClient, params: dict[str, Any], field: str, words: str
) -> None:
    body = {"model": QWEN, "hardware": "H200", **params}
    response = uploader.post("/api/v1/jobs/", body, format="json")
    assert response.status_code == 400, response.content
    assert field in response.json()
    assert words in " ".join(response.json()[field])
    assert AcquisitionJob.objects.count() == 0


def test_it_needs_a_token_to_queue(api: APIClient) -> None:
    response = api.post("/api/v1/jobs/", {"model": QWEN, "hardware": "H200"}, format="json")
    assert response.status_code == 401


def test_it_queues_after_the_commit_to_the_queue_of_its_hardware(
    uploader: APIClient, redis_broker: Any, django_capture_on_commit_callbacks: Any
) -> None:
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        response = uploader.post(
            "/api/v1/jobs/",
            {"model": QWEN, "hardware": "H200", "dp": [2], "ep": [2]},
            format="json",
        )
        assert response.status_code == 201, response.content
        # Nothing is sent before the transaction commits.
        assert _messages(redis_broker, "gpu.H200") == []
    for callback in callbacks:
        callback()
    body = response.json()
    assert body["state"] == "queued"
    assert body["queue"] == "gpu.H200"
    assert body["parameters"]["ep"] == [2]
    assert body["parameters"]["rounds"] == 3  # the CLI's default
    assert body["created_by"] == "uploader"
    assert response["Location"].endswith(f"/api/v1/jobs/{body['id']}")
    assert "--dp 2 --ep 2" in body["command_line"]
    (message,) = _messages(redis_broker, "gpu.H200")
    assert message["headers"]["task"] == "registry.run_acquisition_job"
    assert message["headers"]["argsrepr"] == f"({body['id']},)"
    job = AcquisitionJob.objects.get(pk=body["id"])
    assert job.celery_task_id == message["headers"]["id"]


def test_it_queues_cpu_reference_jobs_on_the_cpu_queue(
    uploader: APIClient, redis_broker: Any, django_capture_on_commit_callbacks: Any
) -> None:
    with django_capture_on_commit_callbacks(execute=True):
        response = uploader.post(
            "/api/v1/jobs/",
            {
                "model": QWEN,
                "hardware": "CPU",
                "device": "cpu",
                "backend": "torch-reference",
            },
            format="json",
        )
    assert response.status_code == 201, response.content
    assert response.json()["queue"] == "cpu"
    assert len(_messages(redis_broker, "cpu")) == 1


def test_it_answers_503_when_the_broker_is_down_while_reads_still_work(
    uploader: APIClient, api: APIClient, broker_down: None, published: Any
) -> None:
    response = uploader.post("/api/v1/jobs/", {"model": QWEN, "hardware": "H200"}, format="json")
    assert response.status_code == 503
    assert response.json()["error"] == "broker_unavailable"
    assert "broker" in response.json()["message"]
    assert AcquisitionJob.objects.count() == 0
    assert api.get("/api/v1/jobs/").status_code == 200
    assert api.get("/api/v1/bundles/").status_code == 200
    assert api.get(f"/api/v1/bundles/{published.pk}/").status_code == 200
    lookup = api.post(
        "/api/v1/lookup",
        {
            "bundle": published.pk,
            "target": {"tp": 1, "dp": 2, "rank": 0},
            "queries": [{"component": "gate_routing", "tokens": 8}],
        },
        format="json",
    )
    assert lookup.status_code == 200
    assert "time_us" in lookup.json()["answers"][0]


def _job(**fields: Any) -> AcquisitionJob:
    params = {"model": QWEN, "hardware": "H200", "device": "cuda"}
    return AcquisitionJob.objects.create(parameters=params, queue="gpu.H200", **fields)


def test_it_cancels_a_queued_job_at_once_and_refuses_to_cancel_twice(
    uploader: APIClient, redis_broker: Any, django_capture_on_commit_callbacks: Any
) -> None:
    with django_capture_on_commit_callbacks(execute=True):
        pk = uploader.post(
            "/api/v1/jobs/", {"model": QWEN, "hardware": "H200"}, format="json"
        ).json()["id"]
    response = uploader.post(f"/api/v1/jobs/{pk}/cancel")
    assert response.status_code == 200
    assert response.json()["state"] == "cancelled"
    assert uploader.post(f"/api/v1/jobs/{pk}/cancel").status_code == 409
    # The message still in the queue finds the job cancelled and does nothing.
    assert claim_job(pk, "gpu0@host") is None


def test_it_lets_only_the_creator_or_staff_change_a_job(api: APIClient, db: None) -> None:
    from django.contrib.auth import get_user_model
    from rest_framework.authtoken.models import Token

    job = _job()
    other = get_user_model().objects.create_user("mallory")
    api.credentials(HTTP_AUTHORIZATION=f"Token {Token.objects.create(user=other).key}")
    assert api.post(f"/api/v1/jobs/{job.pk}/cancel").status_code == 403
    api.credentials()
    assert api.post(f"/api/v1/jobs/{job.pk}/cancel").status_code == 401


def test_it_retries_only_failed_or_cancelled_jobs(
    uploader: APIClient, redis_broker: Any, django_capture_on_commit_callbacks: Any
) -> None:
    from django.contrib.auth import get_user_model

    owner = get_user_model().objects.get(username="uploader")
    queued = _job(created_by=owner)
    assert uploader.post(f"/api/v1/jobs/{queued.pk}/retry").status_code == 409
    failed = _job(created_by=owner, state="failed", error="boom", finished_at=timezone.now())
    with django_capture_on_commit_callbacks(execute=True):
        response = uploader.post(f"/api/v1/jobs/{failed.pk}/retry")
    assert response.status_code == 200
    assert response.json()["state"] == "queued"
    assert response.json()["error"] == ""
    assert len(_messages(redis_broker, "gpu.H200")) == 1


def test_it_skips_deliveries_of_finished_jobs_and_of_jobs_a_live_worker_runs(db: None) -> None:
    done = _job(state="succeeded")
    assert claim_job(done.pk, "gpu0@host") is None
    live = _job(state="running", worker="gpu1@host")
    assert claim_job(live.pk, "gpu0@host") is None
    # The same node name again means that node restarted: its old run is dead, so resume.
    again = claim_job(live.pk, "gpu1@host")
    assert again is not None and again.attempts == 1
    assert claim_job(10**9, "gpu0@host") is None


def test_it_resends_jobs_left_running_by_a_dead_worker(
    redis_broker: Any, settings: Any, django_capture_on_commit_callbacks: Any
) -> None:
    mine = _job(state="running", worker="gpu0@host")
    other_live = _job(state="running", worker="gpu1@host")
    other_queue = AcquisitionJob.objects.create(
        parameters={"model": QWEN, "hardware": "B200"},
        queue="gpu.B200",
        state="running",
        worker="gpu0@host",
    )
    assert recover_jobs("gpu0@host", ["gpu.H200"]) == [mine.pk]
    assert AcquisitionJob.objects.get(pk=mine.pk).state == "queued"
    assert AcquisitionJob.objects.get(pk=other_live.pk).state == "running"
    assert AcquisitionJob.objects.get(pk=other_queue.pk).state == "running"
    settings.REGISTRY = {**settings.REGISTRY, "JOB_STALE_S": 0}
    assert recover_jobs("gpu2@host", ["gpu.H200"]) == [other_live.pk]
    assert len(_messages(redis_broker, "gpu.H200")) == 2


def test_it_shows_a_job_with_its_progress(api: APIClient, published: Any) -> None:
    job = _job(
        state="running",
        phase="measure",
        points_done=3,
        points_total=12,
        eta_seconds=4.5,
        log_tail="measuring",
        result_bundle=published,
    )
    body = api.get(f"/api/v1/jobs/{job.pk}").json()
    assert (body["state"], body["phase"], body["points_done"], body["points_total"]) == (
        "running",
        "measure",
        3,
        12,
    )
    assert body["progress"] == 0.25
    assert body["eta_seconds"] == 4.5
    assert body["log_tail"] == "measuring"
    assert body["result_bundle"]["id"] == published.pk
    assert body["result_bundle"]["download"].endswith(f"/bundles/{published.pk}/download")
    listed = api.get("/api/v1/jobs/?state=running").json()
    assert [j["id"] for j in listed["results"]] == [job.pk]
    assert api.get("/api/v1/jobs/?state=failed").json()["results"] == []
    assert api.get("/api/v1/jobs/999999/").status_code == 404


def test_it_validates_without_importing_torch() -> None:
    code = (
        "import django, sys; django.setup()\n"
        "from registry.jobs.parameters import validate_parameters\n"
        f"validate_parameters({{'model': {QWEN!r}, 'hardware': 'H200', 'dp': [2], 'ep': [2]}})\n"
        "assert 'torch' not in sys.modules and 'vllm' not in sys.modules\n"
    )
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "config.settings"}
    subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, check=True, timeout=60)


def test_it_serves_only_the_artifacts_it_listed(api: APIClient, db: None, tmp_path: Any) -> None:
    (tmp_path / "acquisition.log").write_text("step 1\nboom\n")
    (tmp_path / "secret.txt").write_text("not an artifact")
    job = _job(
        state="failed",
        work_dir=str(tmp_path),
        artifacts=[
            {"name": "acquisition.log", "path": "acquisition.log", "size": 12},
            {"name": "escape", "path": "../../etc/passwd", "size": 1},
        ],
    )
    response = api.get(f"/api/v1/jobs/{job.pk}/artifacts/acquisition.log")
    assert response.status_code == 200
    assert b"".join(response.streaming_content) == b"step 1\nboom\n"
    assert "attachment" in response["Content-Disposition"]
    for name in ("secret.txt", "escape", "..%2Fsecret.txt"):
        assert api.get(f"/api/v1/jobs/{job.pk}/artifacts/{name}").status_code == 404
