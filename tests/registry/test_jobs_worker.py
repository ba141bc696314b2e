"""Acquisition jobs end to end: a real Redis broker, a real Celery worker process, the CPU
reference backend on a tiny model (4 experts, top-2, hidden 16), so that a job takes seconds.

Queue through the API, follow progress, see the bundle published and served; kill -9 the
worker mid-job and start it again (the job resumes from its samples); cancel a running job,
keep its samples, and retry it.

"Mid-job" is made certain, not likely: the kill and cancel tests run their worker with
`hold_after_first_point/` on PYTHONPATH, so that the acquisition stops after its first point
until SIGTERM reaches it (see that folder's sitecustomize.py). Without it the tiny model
finishes its remaining points in about the time it takes to see the first one and act.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from django.db import connection
from rest_framework.test import APIClient

from moetables.bundle import validate_bundle
from registry.models import AcquisitionJob
from tests.registry.conftest import REDIS_URL

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
NODE = "jobs-test@localhost"
HOLD = Path(__file__).resolve().parent / "hold_after_first_point"

TINY_CONFIG = {
    "model_type": "qwen3_moe",
    "hidden_size": 16,
    "moe_intermediate_size": 8,
    "num_experts": 4,
    "num_experts_per_tok": 2,
    "norm_topk_prob": True,
    "torch_dtype": "float32",
    "hidden_act": "silu",
}
# Noise-tolerant settings for a shared CPU; the contract records them.
CPU_JOB = {
    "command": "slice",
    "hardware": "CPU",
    "tp": [1],
    "tp_refresh": [1],
    "max_num_seqs": 2,
    "rounds": 2,
    "iterations": 1,
    "warmup_cycles": 0,
    "backend": "torch-reference",
    "device": "cpu",
    "cache_bytes": 1,
    "quality_tolerance": 0.9,
    "cudagraph_mode": "NONE",
}


@pytest.fixture
def tiny_model(tmp_path: Path, settings: Any, registry_dirs: Path) -> str:
    folder = tmp_path / "models" / "tiny-moe"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(TINY_CONFIG))
    (folder / "catalog.json").write_text(json.dumps({"name": "test/tiny-moe"}))
    settings.REGISTRY = {**settings.REGISTRY, "JOB_MODEL_ROOTS": [str(tmp_path / "models")]}
    return str(folder)


def _database_url() -> str:
    s = connection.settings_dict
    if connection.vendor == "sqlite":
        return f"sqlite:///{s['NAME']}"
    auth = s["USER"] + (f":{s['PASSWORD']}" if s.get("PASSWORD") else "")
    return f"postgres://{auth}@{s['HOST'] or '127.0.0.1'}:{s['PORT'] or 5432}/{s['NAME']}"


class Worker:
    """A Celery worker process on the `cpu` queue, sharing this test's database and folders."""

    def __init__(self, var: Path, models: Path, broker: str, *, hold: bool = False) -> None:
        self.var = var
        self.env = {
            **os.environ,
            "DATABASE_URL": _database_url(),
            "REGISTRY_VAR_DIR": str(var),
            "CELERY_BROKER_URL": broker,
            "CELERY_RESULT_BACKEND": broker,
            "REGISTRY_JOB_MODEL_ROOTS": str(models),
            "PYTHONUNBUFFERED": "1",
        }
        if hold:  # the acquisitions it runs hold after their first point (module docstring)
            self.env["PYTHONPATH"] = os.pathsep.join(
                filter(None, [str(HOLD), os.environ.get("PYTHONPATH")])
            )
        self.log = var / "worker.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.var.mkdir(parents=True, exist_ok=True)
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "celery",
                    "-A",
                    "config",
                    "worker",
                    "--pool",
                    "solo",
                    "--queues",
                    "cpu",
                    "-n",
                    NODE,
                    "--without-gossip",
                    "--without-mingle",
                    "--without-heartbeat",
                    "--loglevel",
                    "INFO",
                ],
                cwd=REPO,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        wait_for(
            lambda: b"ready." in self.log.read_bytes(),
            60,
            "the worker to start",
            lambda: self.log.read_text()[-2000:],
        )

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


@pytest.fixture
def worker(redis_broker: Any, registry_dirs: Path, tiny_model: str) -> Iterator[Worker]:
    running = Worker(registry_dirs, Path(tiny_model).parent, REDIS_URL)
    running.start()
    yield running
    running.stop()


@pytest.fixture
def holding_worker(redis_broker: Any, registry_dirs: Path, tiny_model: str) -> Iterator[Worker]:
    """A worker whose acquisitions hold after their first point until SIGTERM reaches them."""
    running = Worker(registry_dirs, Path(tiny_model).parent, REDIS_URL, hold=True)
    running.start()
    yield running
    running.stop()


def wait_for(
    check: Callable[[], Any], timeout: float, what: str, explain: Callable[[], str] | None = None
) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.1)
    detail = explain() if explain is not None else ""
    raise AssertionError(f"timed out after {timeout}s waiting for {what}\n{detail}")


def job_state(pk: int, *states: str) -> AcquisitionJob | None:
    job = AcquisitionJob.objects.get(pk=pk)
    return job if job.state in states else None


def _queue(uploader: APIClient, model: str, **extra: Any) -> dict[str, Any]:
    response = uploader.post("/api/v1/jobs/", {**CPU_JOB, "model": model, **extra}, format="json")
    assert response.status_code == 201, response.content
    return response.json()


def _explain(worker: Worker, pk: int) -> str:
    job = AcquisitionJob.objects.get(pk=pk)
    return (
        f"{job.state} {job.error}\n{job.log_tail}\n--- worker ---\n{worker.log.read_text()[-3000:]}"
    )


def test_it_runs_a_queued_job_and_publishes_its_bundle(
    worker: Worker, uploader: APIClient, tiny_model: str, api: APIClient
) -> None:
    created = _queue(uploader, tiny_model, max_num_batched_tokens=4)
    assert created["state"] == "queued"  # as queued, even if the free worker already has it
    assert created["queue"] == "cpu"
    pk = created["id"]
    seen = wait_for(lambda: job_state(pk, "running", "succeeded", "failed"), 60, "the job to start")
    assert seen.state != "failed", _explain(worker, pk)
    done = wait_for(lambda: job_state(pk, "succeeded", "failed"), 90, "the job to end")
    assert done.state == "succeeded", _explain(worker, pk)

    # The creator sees the server-side work_dir; anonymous readers do not (issue 17, item 9).
    body = uploader.get(f"/api/v1/jobs/{pk}/").json()
    assert api.get(f"/api/v1/jobs/{pk}/").json()["work_dir"] is None
    assert body["phase"] == "done"
    assert body["points_done"] == body["points_total"] > 0
    assert body["eta_seconds"] == 0.0
    assert "published 1 targets" in body["log_tail"]
    assert body["started_at"] and body["finished_at"]
    assert {a["name"] for a in body["artifacts"]} >= {"acquisition.log", "progress.jsonl"}
    bundle = body["result_bundle"]
    assert (bundle["hardware"], bundle["model"], bundle["variant"]) == (
        "CPU",
        "test/tiny-moe",
        "fp32",
    )

    served = api.get(f"/api/v1/bundles/{bundle['id']}/").json()
    assert served["source"] == "acquisition"
    assert served["source_detail"] == f"acquisition job {pk}"
    assert len(served["tables"]) == 1
    answer = api.post(
        "/api/v1/lookup",
        {
            "bundle": bundle["id"],
            "target": {"tp": 1, "dp": 1, "rank": 0},
            "queries": [{"component": "gate_routing", "tokens": 2}],
        },
        format="json",
    ).json()
    assert answer["answers"][0]["time_us"] > 0

    phases = [
        json.loads(line)["phase"]
        for line in (Path(body["work_dir"]) / "progress.jsonl").read_text().splitlines()
    ]
    assert phases[0] == "plan" and "measure" in phases and phases[-1] == "done"


def _resumed_points(work_dir: str) -> int:
    events = [
        json.loads(line) for line in (Path(work_dir) / "progress.jsonl").read_text().splitlines()
    ]
    return max((e["points_done"] for e in events if "resumed" in e.get("message", "")), default=0)


def _cancelled_points(work_dir: str) -> int:
    """The acquisition's own count in its last ``cancelled`` event (progress.jsonl)."""
    events = [
        json.loads(line) for line in (Path(work_dir) / "progress.jsonl").read_text().splitlines()
    ]
    return int([e for e in events if e.get("phase") == "cancelled"][-1]["points_done"])


def _last_phase(work_dir: str) -> str:
    lines = (Path(work_dir) / "progress.jsonl").read_text().splitlines()
    return str(json.loads(lines[-1])["phase"]) if lines else ""


def _samples(work_dir: str) -> int:
    files = list((Path(work_dir) / "out" / "_acquisition").rglob("samples.jsonl"))
    return sum(len(f.read_text().splitlines()) for f in files)


LONG = {"max_num_batched_tokens": 64, "rounds": 3, "iterations": 2}


def test_it_resumes_a_job_after_its_worker_is_killed(
    holding_worker: Worker, uploader: APIClient, tiny_model: str, api: APIClient
) -> None:
    worker = holding_worker
    pk = _queue(uploader, tiny_model, **LONG)["id"]
    mid = wait_for(
        lambda: (j := AcquisitionJob.objects.get(pk=pk)).points_done >= 1 and j,
        90,
        "the first measured point",
    )
    worker.kill()
    # The kernel sends the acquisition SIGTERM when its worker dies (PR_SET_PDEATHSIG): it
    # stops and keeps its samples before the restarted worker resumes in the same folder.
    wait_for(
        lambda: _last_phase(mid.work_dir) == "cancelled",
        60,
        "the acquisition to stop with its worker",
    )
    killed = AcquisitionJob.objects.get(pk=pk)
    assert killed.state == "running", _explain(worker, pk)
    # The job shows what the worker relayed before it died; the acquisition itself counted
    # the first batch's points (the hook holds as its checkpoint-and-count section ends).
    stopped_at = _cancelled_points(mid.work_dir)
    assert 1 <= killed.points_done <= stopped_at < killed.points_total == 20
    assert _samples(mid.work_dir) >= 1

    worker.start()
    done = wait_for(lambda: job_state(pk, "succeeded", "failed"), 120, "the resumed job to end")
    assert done.state == "succeeded", _explain(worker, pk)
    assert done.attempts == 2
    # R9: what the stopped run counted is exactly what the resume finds in its checkpoint.
    assert _resumed_points(done.work_dir) == stopped_at
    bundle = done.result_bundle
    assert bundle is not None
    from registry.bundles.services import checkout_bundle

    assert validate_bundle(checkout_bundle(bundle)).problems == []
    served = api.get(f"/api/v1/bundles/{bundle.pk}/").json()
    assert served["tables"][0]["coverage"]["complete"] is True


def test_it_cancels_a_running_job_and_a_retry_resumes_it(
    holding_worker: Worker, uploader: APIClient, tiny_model: str
) -> None:
    worker = holding_worker
    pk = _queue(uploader, tiny_model, **LONG)["id"]
    wait_for(lambda: AcquisitionJob.objects.get(pk=pk).points_done >= 1, 90, "a measured point")
    response = uploader.post(f"/api/v1/jobs/{pk}/cancel")
    assert response.status_code == 200
    assert response.json()["cancel_requested"] is True
    cancelled = wait_for(
        lambda: job_state(pk, "cancelled", "succeeded", "failed"), 60, "the job to stop"
    )
    assert cancelled.state == "cancelled", _explain(worker, pk)
    assert cancelled.finished_at is not None
    assert 1 <= cancelled.points_done < cancelled.points_total == 20
    kept = _samples(cancelled.work_dir)
    assert kept >= 1, "the partial samples are kept"
    assert uploader.post(f"/api/v1/jobs/{pk}/cancel").status_code == 409

    retried = uploader.post(f"/api/v1/jobs/{pk}/retry")
    assert retried.status_code == 200
    # The job as the retry left it, although the idle worker may claim it at once.
    body = retried.json()
    assert (body["state"], body["error"], body["cancel_requested"]) == ("queued", "", False)
    done = wait_for(lambda: job_state(pk, "succeeded", "failed"), 120, "the retried job to end")
    assert done.state == "succeeded", _explain(worker, pk)
    assert done.attempts == 2
    assert _resumed_points(done.work_dir) == cancelled.points_done
    assert done.result_bundle is not None
