"""What a worker does with a job: claim it, run the acquisition as a subprocess, follow its
progress events into the row, publish the bundle.

Every step can run again without loss, because a worker may die at any point and the message
is then delivered again (acks_late) or re-sent by `recover_jobs` when a worker starts, or by the
periodic orphan sweep (registry.jobs.sweep):

- the claim is a conditional update (a finished job, or one another live worker runs, is
  skipped), and it counts an attempt;
- every later write of the runner is fenced by that attempt (``state=running,
  attempts=<mine>``): when the job was taken away meanwhile (swept as orphaned, cancelled as
  stale, claimed again by a redelivery) the write matches no row, and the runner stops its
  subprocess and leaves the row to its new owner (`JobLost`);
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
from django.utils import timezone

from registry.choices import BundleSource
from registry.jobs.choices import PUBLISHING_PHASE, JobState
from registry.jobs.models import AcquisitionJob
from registry.jobs.parameters import acquisition_argv
from registry.jobs.workdir import artifacts, log_tail

__all__ = ["JobLost", "begin_publishing", "claim_job", "record", "run_job"]

log = logging.getLogger(__name__)

POLL_S = 0.5
HEARTBEAT_S = 2.0
TERMINATE_GRACE_S = 60.0
EXIT_CANCELLED = 130


class JobLost(RuntimeError):
    """The job is no longer this runner's attempt: another owner or a final state took it."""


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
        resumable = job.state == JobState.RUNNING and (
            job.worker == worker or job.updated_at < stale
        )
        if job.state != JobState.QUEUED and not resumable:
            log.info("job %s is %s on %s; this delivery is skipped", job_id, job.state, job.worker)
            return None
        job.move(
            JobState.RUNNING,
            phase="starting",
            worker=worker,
            attempts=job.attempts + 1,
            started_at=job.started_at or timezone.now(),
            eta_seconds=None,
            work_dir=str(_jobs_dir() / f"job-{job.pk}"),
        )
    return job


def _die_with_parent() -> None:  # pragma: no cover - runs in the child before exec
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


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


def _lost_by(job: AcquisitionJob) -> JobLost:
    return JobLost(f"job {job.pk}: attempt {job.attempts} on {job.worker} no longer owns it")


def record(job: AcquisitionJob, fields: Iterable[str]) -> None:
    """Write ``fields`` and the heartbeat, fenced by this attempt; `JobLost` if it is not ours."""
    now = timezone.now()
    values = {name: getattr(job, name) for name in fields}
    if not AcquisitionJob.objects.attempt(job).touch(**values, updated_at=now):
        raise _lost_by(job)
    job.updated_at = now


_PROGRESS_FIELDS = ("phase", "points_done", "points_total", "eta_seconds", "log_tail")


def _run_subprocess(job: AcquisitionJob, work: Path) -> tuple[int, dict[str, Any] | None, str]:
    """Run the acquisition to its end; returns (exit status, last event, why it was stopped)."""
    progress = work / "progress.jsonl"
    log_path = work / "acquisition.log"
    follower = ProgressFollower(progress, progress.stat().st_size if progress.exists() else 0)
    argv = [
        sys.executable,
        "-m",
        "acquisition",
        *acquisition_argv(job.parameters, out_root=work / "out", progress_json=progress),
    ]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with log_path.open("ab") as log_file:
        log_file.write(
            f"\n=== attempt {job.attempts} on {job.worker} at "
            f"{timezone.now().isoformat()}\n$ {shlex.join(argv)}\n".encode()
        )
        log_file.flush()
        proc = subprocess.Popen(
            argv,
            cwd=settings.BASE_DIR,
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )
    try:
        return _follow(job, proc, follower, log_path)
    except Exception:
        # JobLost (the job was taken from this runner) or a failure of the runner itself: the
        # acquisition must not go on writing into the work folder unwatched.
        _stop(proc)
        raise
    except BaseException:
        # The worker is going down: do not hold it up (PR_SET_PDEATHSIG covers a hard death).
        with contextlib.suppress(OSError):
            proc.send_signal(signal.SIGTERM)
        raise


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)  # the acquisition keeps its samples
    try:
        proc.wait(TERMINATE_GRACE_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _follow(
    job: AcquisitionJob, proc: subprocess.Popen[bytes], follower: ProgressFollower, log_path: Path
) -> tuple[int, dict[str, Any] | None, str]:
    limit_s = float(settings.REGISTRY["JOB_TIME_LIMIT_S"])
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
            job.log_tail = log_tail(log_path)
            record(job, _PROGRESS_FIELDS)
            last_save = now
            requested = (
                AcquisitionJob.objects.filter(pk=job.pk)
                .values_list("cancel_requested", flat=True)
                .first()
            )
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


def _finish(
    job: AcquisitionJob, state: JobState, *, phase: str, error: str = "", failed: bool = False
) -> None:
    """End this attempt in ``state`` (succeeded, failed or cancelled), fenced like `record`."""
    work = Path(job.work_dir)
    fields = {
        "error": error,
        "eta_seconds": 0.0 if state == JobState.SUCCEEDED else None,
        "log_tail": log_tail(work / "acquisition.log"),
        "artifacts": artifacts(work, failed),
        "result_bundle": job.result_bundle,
    }
    if not AcquisitionJob.objects.attempt(job).move(JobState.RUNNING, state, phase=phase, **fields):
        raise _lost_by(job)
    job.state, job.phase = state, phase
    for name, value in fields.items():
        setattr(job, name, value)


def begin_publishing(job: AcquisitionJob) -> bool:
    """Enter the publishing phase unless a cancel was requested first; False if it was.

    One conditional update decides between a cancel request and publishing: `cancel_job`
    changes the row under its lock, so exactly one of them sees the other. A request accepted
    before this point ends the job cancelled, even when the acquisition had already finished
    (its finished run is kept: a retry only publishes it); after it, cancel is refused.
    """
    mine = AcquisitionJob.objects.attempt(job)
    if mine.filter(cancel_requested=False).touch(phase=PUBLISHING_PHASE):
        job.phase = PUBLISHING_PHASE
        return True
    if not mine.exists():
        raise _lost_by(job)
    return False


def _publish_or_cancel(job: AcquisitionJob, bundle_dir: Path) -> None:
    if begin_publishing(job):
        _publish(job, bundle_dir)
    else:
        _finish(job, JobState.CANCELLED, phase="cancelled")


def _publish(job: AcquisitionJob, bundle_dir: Path) -> None:
    from registry.bundles.services import PublishError, publish_bundle

    try:
        result = publish_bundle(
            bundle_dir,
            source_kind=BundleSource.ACQUISITION,
            source_detail=f"acquisition job {job.pk}",
            published_by=job.created_by,
        )
    except PublishError as exc:
        _finish(
            job,
            JobState.FAILED,
            failed=True,
            phase="failed",
            error="the registry refused the bundle: " + "; ".join(exc.problems),
        )
        return
    job.result_bundle = result.bundle
    _finish(job, JobState.SUCCEEDED, phase="done")
    from registry.services.requests import close_filled_requests

    close_filled_requests(result.bundle, job)


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
            _publish_or_cancel(job, bundle)
            return str(job.state)
        rc, last, stopped = _run_subprocess(job, work)
        if rc == 0 and (bundle := _bundle_of(last)) is not None:
            _publish_or_cancel(job, bundle)
        elif stopped == "cancelled":
            _finish(job, JobState.CANCELLED, phase="cancelled")
        elif stopped:
            _finish(job, JobState.FAILED, failed=True, phase="failed", error=stopped)
        else:
            error = (last or {}).get("error") if (last or {}).get("phase") == "failed" else None
            if not error:
                lines = [ln for ln in log_tail(work / "acquisition.log", 2048).splitlines() if ln]
                error = f"the acquisition exited with status {rc}: " + " | ".join(lines[-3:])
            _finish(job, JobState.FAILED, failed=True, phase="failed", error=str(error))
    except JobLost as exc:
        return _lost(exc)
    except Exception:
        log.exception("job %s failed in the worker", job_id)
        try:
            _finish(
                job,
                JobState.FAILED,
                failed=True,
                phase="failed",
                error="the worker failed: " + traceback.format_exc(limit=5),
            )
        except JobLost as exc:
            return _lost(exc)
    return str(job.state)


def _lost(exc: JobLost) -> str:
    log.warning("%s; its subprocess was stopped and the row left to its new owner", exc)
    return "lost"
