"""What a worker does with a job: claim it, run the acquisition as a subprocess, follow its
progress events into the row, publish the bundle.

Every step can run again without loss, because a worker may die at any point and the message
is then delivered again (acks_late) or re-sent by `recover_jobs` when a worker starts:

- the claim is a conditional update (a finished job, or one another live worker runs, is
  skipped);
- the work folder is the job's own (``JOBS_DIR/job-<id>``), so a rerun finds its
  ``samples.jsonl`` and the acquisition resumes instead of measuring again;
- a run whose progress already ended in ``done`` is not run again, only published;
- publishing the same content twice gives the same bundle.

The worker never imports torch: the acquisition runs in ``python -m acquisition``. The child is
asked to receive SIGTERM when the worker dies (Linux ``PR_SET_PDEATHSIG``), and SIGTERM makes
the acquisition stop and keep its samples, so a killed worker leaves no orphan writing into the
folder the redelivered job will use.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import logging
import os
import shlex
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Iterable
from datetime import timedelta
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from registry.choices import BundleSource
from registry.jobs.choices import JobState
from registry.jobs.models import AcquisitionJob
from registry.jobs.parameters import acquisition_argv

__all__ = ["claim_job", "recover_jobs", "run_job"]

log = logging.getLogger(__name__)

LOG_TAIL_BYTES = 8192
POLL_S = 0.5
HEARTBEAT_S = 2.0
TERMINATE_GRACE_S = 60.0
EXIT_CANCELLED = 130


def _jobs_dir() -> Path:
    return Path(settings.REGISTRY["JOBS_DIR"])


def claim_job(job_id: int, worker: str) -> AcquisitionJob | None:
    """Mark the job running on ``worker``, or None when it is not this worker's to run."""
    stale = timezone.now() - timedelta(seconds=settings.REGISTRY["JOB_STALE_S"])
    with transaction.atomic():
        job = AcquisitionJob.objects.select_for_update().filter(pk=job_id).first()
        if job is None:
            log.warning("job %s: no such job; message dropped", job_id)
            return None
        resumable = job.state == JobState.RUNNING and (job.worker == worker or
                                                         job.updated_at < stale)
        if job.state != JobState.QUEUED and not resumable:
            log.info("job %s is %s on %s; this delivery is skipped", job_id, job.state,
                     job.worker)
            return None
        now = timezone.now()
        job.state = JobState.RUNNING
        job.worker = worker
        job.attempts += 1
        job.started_at = job.started_at or now
        job.work_dir = str(_jobs_dir() / f"job-{job.pk}")
        job.phase = "starting"
        job.eta_seconds = None
        job.save(update_fields=["state", "worker", "attempts", "started_at", "work_dir",
                                "phase", "eta_seconds", "updated_at"])
    return job


def _die_with_parent() -> None:  # pragma: no cover - runs in the child before exec
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _tail(path: Path, size: int = LOG_TAIL_BYTES) -> str:
    try:
        with path.open("rb") as handle:
            handle.seek(0, os.SEEK_END)
            end = handle.tell()
            handle.seek(max(0, end - size))
            data = handle.read()
    except OSError:
        return ""
    text = data.decode("utf-8", errors="replace")
    return text if end <= size else text.split("\n", 1)[-1]


class ProgressFollower:
    """Reads the JSON lines the acquisition appends, from an offset, whole lines only."""

    def __init__(self, path: Path, offset: int = 0) -> None:
        self.path = path
        self.offset = offset

    def read(self) -> list[dict[str, Any]]:
        try:
            with self.path.open("rb") as handle:
                handle.seek(self.offset)
                data = handle.read()
        except FileNotFoundError:
            return []
        end = data.rfind(b"\n")
        if end < 0:
            return []
        self.offset += end + 1
        events = []
        for line in data[: end + 1].splitlines():
            with contextlib.suppress(ValueError):
                event = json.loads(line)
                if isinstance(event, dict):
                    events.append(event)
        return events


def _last_event(path: Path) -> dict[str, Any] | None:
    events = ProgressFollower(path).read()
    return events[-1] if events else None


def _apply(job: AcquisitionJob, event: dict[str, Any]) -> None:
    job.phase = str(event.get("phase") or job.phase)[:32]
    for field, key in (("points_done", "points_done"), ("points_total", "points_total")):
        value = event.get(key)
        if isinstance(value, int) and value >= 0:
            setattr(job, field, value)
    eta = event.get("eta_s")
    job.eta_seconds = float(eta) if isinstance(eta, int | float) else None


def _artifacts(work: Path, failed: bool) -> list[dict[str, Any]]:
    found: list[Path] = [work / "acquisition.log", work / "progress.jsonl"]
    if failed:
        evidence = work / "out" / "_acquisition"
        if evidence.is_dir():
            found += sorted(evidence.rglob("failures.jsonl"))
            found += sorted(p for p in evidence.rglob("*trace*.json*") if p.is_file())
    return [
        {"name": p.name, "path": p.relative_to(work).as_posix(), "size": p.stat().st_size}
        for p in found
        if p.is_file()
    ]


def _save(job: AcquisitionJob, fields: Iterable[str]) -> None:
    job.save(update_fields=[*fields, "updated_at"])


_PROGRESS_FIELDS = ("phase", "points_done", "points_total", "eta_seconds", "log_tail")


def _run_subprocess(job: AcquisitionJob, work: Path) -> tuple[int, dict[str, Any] | None, str]:
    """Run the acquisition to its end; returns (exit status, last event, why it was stopped)."""
    progress = work / "progress.jsonl"
    log_path = work / "acquisition.log"
    follower = ProgressFollower(progress, progress.stat().st_size if progress.exists() else 0)
    argv = [sys.executable, "-m", "acquisition",
            *acquisition_argv(job.parameters, out_root=work / "out", progress_json=progress)]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    limit_s = float(settings.REGISTRY["JOB_TIME_LIMIT_S"])
    with log_path.open("ab") as log_file:
        log_file.write(f"\n=== attempt {job.attempts} on {job.worker} at "
                       f"{timezone.now().isoformat()}\n$ {shlex.join(argv)}\n".encode())
        log_file.flush()
        proc = subprocess.Popen(
            argv, cwd=settings.BASE_DIR, stdin=subprocess.DEVNULL, stdout=log_file,
            stderr=subprocess.STDOUT, env=env, start_new_session=True,
            preexec_fn=_die_with_parent,
        )
    started = time.monotonic()
    last: dict[str, Any] | None = None
    stopped = ""
    stop_sent_at = 0.0
    last_save = 0.0
    while True:
        rc = proc.poll()
        events = follower.read()
        for event in events:
            _apply(job, event)
            last = event
        now = time.monotonic()
        if events or rc is not None or now - last_save >= HEARTBEAT_S:
            job.log_tail = _tail(log_path)
            _save(job, _PROGRESS_FIELDS)
            last_save = now
            requested = AcquisitionJob.objects.filter(pk=job.pk).values_list(
                "cancel_requested", flat=True).first()
            if requested and not stopped:
                stopped = "cancelled"
            if not stopped and now - started > limit_s:
                stopped = f"exceeded the job time limit of {limit_s:.0f} s"
            if stopped and not stop_sent_at and rc is None:
                proc.send_signal(signal.SIGTERM)
                stop_sent_at = now
        if rc is not None:
            return rc, last, stopped
        if stop_sent_at and now - stop_sent_at > TERMINATE_GRACE_S:
            proc.kill()
        time.sleep(POLL_S)


def _finish(job: AcquisitionJob, state: JobState, *, error: str = "", failed: bool = False,
            phase: str | None = None) -> None:
    work = Path(job.work_dir)
    job.state = state
    job.error = error
    job.finished_at = timezone.now()
    job.phase = phase or job.phase
    if state != JobState.RUNNING:
        job.eta_seconds = None if state != JobState.SUCCEEDED else 0.0
    job.log_tail = _tail(work / "acquisition.log")
    job.artifacts = _artifacts(work, failed)
    _save(job, ["state", "error", "finished_at", "phase", "eta_seconds", "log_tail",
                "artifacts", "result_bundle"])


def _publish(job: AcquisitionJob, bundle_dir: Path) -> None:
    from registry.services import PublishError, publish_bundle

    job.phase = "registry-publish"
    _save(job, ["phase"])
    try:
        result = publish_bundle(
            bundle_dir, source_kind=BundleSource.ACQUISITION,
            source_detail=f"acquisition job {job.pk}", published_by=job.created_by,
        )
    except PublishError as exc:
        _finish(job, JobState.FAILED, failed=True, phase="failed",
                error="the registry refused the bundle: " + "; ".join(exc.problems))
        return
    job.result_bundle = result.bundle
    _finish(job, JobState.SUCCEEDED, phase="done")


def _bundle_of(event: dict[str, Any] | None) -> Path | None:
    if event and event.get("phase") == "done" and event.get("bundle"):
        path = Path(str(event["bundle"]))
        if (path / "meta.yaml").is_file():
            return path
    return None


def run_job(job_id: int, worker: str) -> str:
    """Run one job to its end on this worker; returns the state it ended in (or 'skipped')."""
    job = claim_job(job_id, worker)
    if job is None:
        return "skipped"
    try:
        work = Path(job.work_dir)
        work.mkdir(parents=True, exist_ok=True)
        # A run that already finished (the worker died while publishing) is only published.
        bundle = _bundle_of(_last_event(work / "progress.jsonl"))
        if bundle is not None:
            _publish(job, bundle)
            return str(job.state)
        rc, last, stopped = _run_subprocess(job, work)
        if rc == 0 and (bundle := _bundle_of(last)) is not None:
            _publish(job, bundle)
        elif stopped == "cancelled":
            _finish(job, JobState.CANCELLED, phase="cancelled")
        elif stopped:
            _finish(job, JobState.FAILED, failed=True, phase="failed", error=stopped)
        else:
            error = (last or {}).get("error") if (last or {}).get("phase") == "failed" else None
            if not error:
                lines = [ln for ln in _tail(work / "acquisition.log", 2048).splitlines() if ln]
                error = f"the acquisition exited with status {rc}: " + " | ".join(lines[-3:])
            _finish(job, JobState.FAILED, failed=True, phase="failed", error=str(error))
    except Exception:
        log.exception("job %s failed in the worker", job_id)
        _finish(job, JobState.FAILED, failed=True, phase="failed",
                error="the worker failed: " + traceback.format_exc(limit=5))
    return str(job.state)


def recover_jobs(worker: str, queues: Iterable[str]) -> list[int]:
    """Re-send the running jobs of ``queues`` whose worker died.

    Called when a worker starts: a job still marked running on this very node name cannot be
    running (the node was just started), and one nobody has written for JOB_STALE_S seconds has
    lost its worker. With Redis the original message would come back only after the visibility
    timeout (longer than the longest job); the embedded broker never brings it back.
    """
    from registry.jobs.services import BrokerUnavailable, send_job

    stale = timezone.now() - timedelta(seconds=settings.REGISTRY["JOB_STALE_S"])
    orphans = AcquisitionJob.objects.filter(state=JobState.RUNNING, queue__in=list(queues)).filter(
        Q(worker=worker) | Q(updated_at__lt=stale))
    recovered = []
    for job in orphans:
        updated = AcquisitionJob.objects.filter(pk=job.pk, state=JobState.RUNNING).update(
            state=JobState.QUEUED, phase="requeued", updated_at=timezone.now())
        if not updated:
            continue
        try:
            send_job(job)
        except BrokerUnavailable:
            log.exception("job %s: could not be re-sent", job.pk)
            continue
        log.warning("job %s: its worker %s died; re-sent to %s", job.pk, job.worker, job.queue)
        recovered.append(job.pk)
    return recovered
