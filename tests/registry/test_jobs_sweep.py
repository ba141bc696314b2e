"""The orphan sweep: a running job whose heartbeat went silent is re-sent (or failed after too
many starts, or cancelled if that was asked), a queued job whose message was lost is sent
again, a live job is left alone, a second sweep changes nothing more, and a runner that lost
its job to the sweep can no longer write it. On a real Redis broker and a real database; the
scheduled run is a real `celery worker -B` on the embedded filesystem broker.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.utils import timezone

from config.celery import SWEEP_TASK, app
from registry.jobs import JobStateError, cancel_job
from registry.jobs.runner import JobLost, begin_publishing, claim_job, record
from registry.jobs.sweep import SweepAction, release_orphan, sweep_orphaned_jobs
from registry.models import AcquisitionJob
from tests.registry.test_jobs_worker import _database_url, wait_for

pytestmark = [pytest.mark.django_db]

REPO = Path(__file__).resolve().parents[2]
QWEN = "Qwen/Qwen3-30B-A3B-Instruct-2507"
QUEUE = "gpu.H200"


def _job(*, silent_s: float = 0.0, **fields: Any) -> AcquisitionJob:
    """A job row as a worker left it; ``silent_s``: seconds since its last write."""
    params = {"model": QWEN, "hardware": "H200", "device": "cuda"}
    job = AcquisitionJob.objects.create(parameters=params, queue=QUEUE, **fields)
    if silent_s:
        AcquisitionJob.objects.filter(pk=job.pk).update(
            updated_at=timezone.now() - timedelta(seconds=silent_s)
        )
    job.refresh_from_db()
    return job


def _message_ids(redis: Any, queue: str = QUEUE) -> list[str]:
    return [json.loads(raw)["headers"]["id"] for raw in redis.lrange(queue, 0, -1)]


def _row(job: AcquisitionJob) -> dict[str, Any]:
    return AcquisitionJob.objects.filter(pk=job.pk).values().get()


def test_it_requeues_a_silent_running_job_and_leaves_a_live_one_alone(redis_broker: Any) -> None:
    silent = _job(
        state="running",
        worker="gpu0@lost",
        attempts=1,
        silent_s=600,
        phase="measure",
        points_done=3,
        points_total=9,
        eta_seconds=12.0,
    )
    live = _job(state="running", worker="gpu1@host", attempts=1, silent_s=5)
    live_before = _row(live)

    released = sweep_orphaned_jobs()

    assert [(r.job_id, r.action) for r in released] == [(silent.pk, SweepAction.REQUEUED)]
    assert "gpu0@lost" in released[0].reason and "no heartbeat" in released[0].reason
    requeued = AcquisitionJob.objects.get(pk=silent.pk)
    assert (requeued.state, requeued.phase, requeued.eta_seconds) == ("queued", "requeued", None)
    assert requeued.points_done == 3  # progress so far stays shown; the rerun resumes
    assert requeued.celery_task_id and _message_ids(redis_broker) == [requeued.celery_task_id]
    assert _row(live) == live_before

    # Nothing more the second time: the re-sent job's message is there, the live one is live.
    assert sweep_orphaned_jobs() == []
    assert _message_ids(redis_broker) == [requeued.celery_task_id]
    assert _row(live) == live_before
    # The re-sent message is claimed like any other and the job runs again (attempt 2).
    again = claim_job(silent.pk, "gpu2@host")
    assert again is not None and (again.state, again.attempts) == ("running", 2)


def test_it_fails_a_job_that_lost_its_worker_after_the_last_allowed_start(
    redis_broker: Any, settings: Any
) -> None:
    settings.REGISTRY = {**settings.REGISTRY, "JOB_MAX_ATTEMPTS": 2}
    tired = _job(
        state="running", worker="gpu0@lost", attempts=2, silent_s=600, work_dir="/nowhere/job-7"
    )

    (released,) = sweep_orphaned_jobs()

    assert released.action == SweepAction.FAILED
    failed = AcquisitionJob.objects.get(pk=tired.pk)
    assert (failed.state, failed.phase) == ("failed", "failed")
    assert failed.finished_at is not None
    assert "gpu0@lost" in failed.error and "started 2 times" in failed.error
    assert "REGISTRY_JOB_MAX_ATTEMPTS=2" in failed.error and "retry resumes" in failed.error
    assert _message_ids(redis_broker) == []
    assert sweep_orphaned_jobs() == []
    assert AcquisitionJob.objects.get(pk=tired.pk).finished_at == failed.finished_at


def test_it_cancels_a_silent_job_whose_cancel_nobody_carried_out(redis_broker: Any) -> None:
    asked = _job(
        state="running", worker="gpu0@lost", attempts=1, silent_s=600, cancel_requested=True
    )
    (released,) = sweep_orphaned_jobs()
    assert released.action == SweepAction.CANCELLED
    cancelled = AcquisitionJob.objects.get(pk=asked.pk)
    assert (cancelled.state, cancelled.phase) == ("cancelled", "cancelled")
    assert _message_ids(redis_broker) == []
    assert sweep_orphaned_jobs() == []


def test_it_leaves_a_job_to_whoever_changed_it_after_it_was_read(redis_broker: Any) -> None:
    # Sweeps overlap (beat, the command, a worker's start) and runners write heartbeats: each
    # release repeats what it read, so only the first change of a row takes effect.
    job = claim_job(_job().pk, "gpu0@host")
    assert job is not None
    AcquisitionJob.objects.filter(pk=job.pk).update(
        updated_at=timezone.now() - timedelta(seconds=600)
    )
    seen = AcquisitionJob.objects.get(pk=job.pk)

    # The runner was only slow: its heartbeat lands after both sweeps read the row.
    job.phase = "measure"
    record(job, ["phase"])
    assert release_orphan(seen, "silent") is None
    assert AcquisitionJob.objects.get(pk=job.pk).state == "running"

    # Then it really goes silent: one sweep requeues it, the other one finds it changed.
    AcquisitionJob.objects.filter(pk=job.pk).update(
        updated_at=timezone.now() - timedelta(seconds=600)
    )
    seen_by_a = AcquisitionJob.objects.get(pk=job.pk)
    seen_by_b = AcquisitionJob.objects.get(pk=job.pk)
    assert release_orphan(seen_by_a, "silent") is not None
    assert release_orphan(seen_by_b, "silent") is None
    assert len(_message_ids(redis_broker)) == 1


def test_it_stops_a_runner_from_writing_a_job_the_sweep_took(redis_broker: Any) -> None:
    job = claim_job(_job().pk, "gpu0@host")
    assert job is not None
    AcquisitionJob.objects.filter(pk=job.pk).update(
        updated_at=timezone.now() - timedelta(seconds=600)
    )
    (released,) = sweep_orphaned_jobs()
    assert released.action == SweepAction.REQUEUED
    # The old runner wakes up: neither its heartbeat nor its publishing may touch the row.
    job.phase = "measure"
    with pytest.raises(JobLost):
        record(job, ["phase"])
    with pytest.raises(JobLost):
        begin_publishing(job)
    assert AcquisitionJob.objects.get(pk=job.pk).state == "queued"


def test_it_resends_a_queued_job_only_when_its_message_is_lost(
    uploader: Any, redis_broker: Any, django_capture_on_commit_callbacks: Any
) -> None:
    with django_capture_on_commit_callbacks(execute=True):
        response = uploader.post(
            "/api/v1/jobs/", {"model": QWEN, "hardware": "H200"}, format="json"
        )
    assert response.status_code == 201, response.content
    pk = response.json()["id"]
    sent = AcquisitionJob.objects.get(pk=pk).celery_task_id
    assert _message_ids(redis_broker) == [sent]
    AcquisitionJob.objects.filter(pk=pk).update(updated_at=timezone.now() - timedelta(seconds=600))

    # Waiting long, but its message is there: no worker of gpu.H200 is free yet.
    assert sweep_orphaned_jobs() == []
    assert _message_ids(redis_broker) == [sent]

    redis_broker.delete(QUEUE)  # the broker loses it
    (released,) = sweep_orphaned_jobs()
    assert (released.job_id, released.action) == (pk, SweepAction.RESENT)
    assert "lost" in released.reason
    resent = AcquisitionJob.objects.get(pk=pk)
    assert resent.state == "queued" and resent.celery_task_id != sent
    assert _message_ids(redis_broker) == [resent.celery_task_id]
    assert sweep_orphaned_jobs() == []
    assert _message_ids(redis_broker) == [resent.celery_task_id]


def test_it_sweeps_by_hand_with_a_dry_run_first(redis_broker: Any, capsys: Any) -> None:
    silent = _job(state="running", worker="gpu0@lost", attempts=1, silent_s=600)
    call_command("sweep_jobs", "--dry-run")
    out = capsys.readouterr().out
    assert f"job {silent.pk}: would be requeued" in out and "would release 1" in out
    assert AcquisitionJob.objects.get(pk=silent.pk).state == "running"
    assert _message_ids(redis_broker) == []

    call_command("sweep_jobs", "--queue", "gpu.B200")
    assert "released 0 orphaned jobs" in capsys.readouterr().out
    call_command("sweep_jobs")
    assert f"job {silent.pk}: requeued" in capsys.readouterr().out
    assert AcquisitionJob.objects.get(pk=silent.pk).state == "queued"
    call_command("sweep_jobs")
    assert "released 0 orphaned jobs" in capsys.readouterr().out


def test_it_lets_an_accepted_cancel_win_over_publishing(db: None) -> None:
    asked = claim_job(_job().pk, "gpu0@host")
    assert asked is not None
    assert cancel_job(asked).cancel_requested is True
    assert begin_publishing(asked) is False  # the runner then ends it cancelled

    publishing = claim_job(_job().pk, "gpu0@host")
    assert publishing is not None
    assert begin_publishing(publishing) is True
    with pytest.raises(JobStateError, match="publishing"):
        cancel_job(publishing)


def test_it_schedules_the_sweep_with_celery_beat(settings: Any) -> None:
    entry = app.conf.beat_schedule[SWEEP_TASK]
    # What a starting worker does: discover the tasks modules (registry/jobs/tasks.py).
    app.loader.import_default_modules()
    assert entry["task"] == SWEEP_TASK and SWEEP_TASK in app.tasks
    assert entry["schedule"] == settings.REGISTRY["JOB_SWEEP_S"]
    assert entry["options"]["queue"] == "default"
    assert app.conf.beat_schedule_filename.endswith("celery/beat-schedule")


@pytest.fixture
def beat_worker(transactional_db: None, tmp_path: Path) -> Iterator[Path]:
    """The run command's housekeeping worker (embedded beat, queue default, filesystem broker),
    sweeping every second; yields its log."""
    var = tmp_path / "beat-var"
    var.mkdir()
    log = var / "worker.log"
    env = {
        **os.environ,
        "DATABASE_URL": _database_url(),
        "REGISTRY_VAR_DIR": str(var),
        "CELERY_BROKER_URL": "filesystem://",
        "REGISTRY_JOB_SWEEP_S": "1",
        "PYTHONUNBUFFERED": "1",
    }
    env.pop("CELERY_RESULT_BACKEND", None)
    # As scripts/run.sh does: the embedded broker's folders under REGISTRY_VAR_DIR/celery.
    subprocess.run(
        [
            sys.executable,
            "-c",
            "import django; django.setup(); "
            "from config.celery import ensure_broker_folders; ensure_broker_folders()",
        ],
        cwd=REPO,
        env={**env, "DJANGO_SETTINGS_MODULE": "config.settings"},
        check=True,
        timeout=60,
    )
    with log.open("ab") as out:
        proc = subprocess.Popen(
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
                "default",
                "-B",
                "-n",
                "registry-test@localhost",
                "--without-gossip",
                "--without-mingle",
                "--without-heartbeat",
                "--loglevel",
                "INFO",
            ],
            cwd=REPO,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        yield log
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


@pytest.mark.django_db(transaction=True)
def test_it_runs_the_scheduled_sweep_in_the_run_commands_worker(beat_worker: Path) -> None:
    silent = _job(state="running", worker="gpu0@lost", attempts=1, silent_s=600)
    live = _job(state="running", worker="gpu1@host", attempts=1)
    swept = wait_for(
        lambda: (j := AcquisitionJob.objects.get(pk=silent.pk)).state != "running" and j,
        60,
        "the scheduled sweep",
        lambda: beat_worker.read_text()[-3000:],
    )
    assert (swept.state, swept.phase) == ("queued", "requeued")
    assert AcquisitionJob.objects.get(pk=live.pk).state == "running"
    assert f"Task {SWEEP_TASK}" in beat_worker.read_text()
