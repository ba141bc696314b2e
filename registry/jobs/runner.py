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
from django.db.models import Q
from django.utils import timezone

from registry.choices import BundleSource
from registry.jobs.choices import PUBLISHING_PHASE, JobState
from registry.jobs.models import AcquisitionJob
from registry.jobs.parameters import acquisition_argv

__all__ = ["JobLost", "begin_publishing", "claim_job", "recover_jobs", "run_job"]

log = logging.getLogger(__name__)

LOG_TAIL_BYTES = 8192
POLL_S = 0.5
HEARTBEAT_S = 2.0
TERMINATE_GRACE_S = 60.0
EXIT_CANCELLED = 130


class JobLost(RuntimeError):
    """The job is no longer this runner's attempt: another owner or a final state took it."""


def _jobs_dir() -> Path:
    return Path(settings.REGISTRY["JOBS_DIR"])


def _mine(job: AcquisitionJob) -> Any:
    """The job's row, only while it is still this runner's attempt (the fence)."""
    return AcquisitionJob.objects.filter(pk=job.pk, state=JobState.RUNNING, attempts=job.attempts)


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
    """Write ``fields`` and the heartbeat, fenced by this attempt; `JobLost` if it is not ours."""
    job.updated_at = timezone.now()
    values = {name: getattr(job, name) for name in fields}
    if not _mine(job).update(**values, updated_at=job.updated_at):
        raise JobLost(f"job {job.pk}: attempt {job.attempts} on {job.worker} no longer owns it")


_PROGRESS_FIELDS = ("phase", "points_done", "points_total", "eta_seconds", "log_tail")


def _run_subprocess(job: AcquisitionJob, work: Path) -> tuple[int, dict[str, Any] | None, str]:
    """Run the acquisition to its end; returns (exit status, last event, why it was stopped)."""
    progress = work / "progress.jsonl"
    log_path = work / "acquisition.log"
    follower = ProgressFollower(progress, progress.stat().st_size if progress.exists() else 0)
    argv = [sys.executable, "-m", "acquisition",
            *acquisition_argv(job.parameters, out_root=work / "out", progress_json=progress)]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with log_path.open("ab") as log_file:
        log_file.write(f"\n=== attempt {job.attempts} on {job.worker} at "
                       f"{timezone.now().isoformat()}\n$ {shlex.join(argv)}\n".encode())
        log_file.flush()
        proc = subprocess.Popen(
            argv, cwd=settings.BASE_DIR, stdin=subprocess.DEVNULL, stdout=log_file,
            stderr=subprocess.STDOUT, env=env, start_new_session=True,
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


def _follow(job: AcquisitionJob, proc: subprocess.Popen[bytes], follower: ProgressFollower,
            log_path: Path) -> tuple[int, dict[str, Any] | None, str]:
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


def begin_publishing(job: AcquisitionJob) -> bool:
    """Enter the publishing phase unless a cancel was requested first; False if it was.

    One conditional update decides between a cancel request and publishing: `cancel_job`
    changes the row under its lock, so exactly one of them sees the other. A request accepted
    before this point ends the job cancelled, even when the acquisition had already finished
    (its finished run is kept: a retry only publishes it); after it, cancel is refused.
    """
    now = timezone.now()
    if _mine(job).filter(cancel_requested=False).update(phase=PUBLISHING_PHASE, updated_at=now):
        job.phase = PUBLISHING_PHASE
        job.updated_at = now
        return True
    if not _mine(job).exists():
        raise JobLost(f"job {job.pk}: attempt {job.attempts} on {job.worker} no longer owns it")
    return False


def _publish_or_cancel(job: AcquisitionJob, bundle_dir: Path) -> None:
    if begin_publishing(job):
        _publish(job, bundle_dir)
    else:
        _finish(job, JobState.CANCELLED, phase="cancelled")


def _publish(job: AcquisitionJob, bundle_dir: Path) -> None:
    from registry.services import PublishError, publish_bundle

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
                lines = [ln for ln in _tail(work / "acquisition.log", 2048).splitlines() if ln]
                error = f"the acquisition exited with status {rc}: " + " | ".join(lines[-3:])
            _finish(job, JobState.FAILED, failed=True, phase="failed", error=str(error))
    except JobLost as exc:
        return _lost(exc)
    except Exception:
        log.exception("job %s failed in the worker", job_id)
        try:
            _finish(job, JobState.FAILED, failed=True, phase="failed",
                    error="the worker failed: " + traceback.format_exc(limit=5))
        except JobLost as exc:
            return _lost(exc)
    return str(job.state)


def _lost(exc: JobLost) -> str:
    log.warning("%s; its subprocess was stopped and the row left to its new owner", exc)
    return "lost"


def recover_jobs(worker: str, queues: Iterable[str]) -> list[int]:
    """Release the running jobs of ``queues`` whose worker died; returns the re-sent ids.

    Called when a worker starts: a job still marked running on this very node name cannot be
    running (the node was just started), and one nobody has written for JOB_STALE_S seconds has
    lost its worker. With Redis the original message would come back only after the visibility
    timeout (longer than the longest job); the embedded broker never brings it back. Each job
    is released as the periodic sweep releases it (`registry.jobs.sweep.release_orphan`):
    re-sent, or failed after JOB_MAX_ATTEMPTS starts, or cancelled if that was asked.
    """
    from registry.jobs.sweep import SweepAction, release_orphan, silence_reason

    stale = timezone.now() - timedelta(seconds=settings.REGISTRY["JOB_STALE_S"])
    orphans = AcquisitionJob.objects.filter(state=JobState.RUNNING, queue__in=list(queues)).filter(
        Q(worker=worker) | Q(updated_at__lt=stale)).order_by("updated_at", "id")
    recovered = []
    for job in orphans:
        why = (f"its worker {worker} restarted while running it" if job.worker == worker
               else silence_reason(job))
        done = release_orphan(job, why)
        if done is not None and done.action == SweepAction.REQUEUED:
            recovered.append(job.pk)
    return recovered
