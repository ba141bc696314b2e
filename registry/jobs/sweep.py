"""The orphan sweep: jobs that no worker will finish are re-sent, failed or cancelled.

A job is orphaned in one of two ways (docs/jobs.md, "Orphaned jobs"):

- **running, silent**: nobody has written it for ``JOB_STALE_S`` seconds. The runner writes the
  row at least every 2 s while it runs, so silence means its worker died (kill -9, OOM, a lost
  host) or lost the database. With Redis the unacknowledged message would come back only after
  the visibility timeout (longer than the longest job); the embedded broker never brings it
  back. The job is re-sent to its queue (it resumes from its samples), failed with the reason
  once it has been started ``JOB_MAX_ATTEMPTS`` times (a job that kills its worker must not
  loop), or cancelled when a cancel was asked for and nobody was left to carry it out.
- **queued, message lost**: queued for ``JOB_STALE_S`` seconds while its queue holds fewer
  ready messages than it has queued jobs. The broker lost data, a worker took the message from
  the embedded broker (which has no acknowledgements) and died before claiming the job, or the
  process that queued it died between the commit and the send. The job is sent again. A queue
  whose messages are all there simply has no free worker yet, and is left alone.

Every change is one conditional UPDATE that repeats what was read (state, attempts,
``updated_at``): a runner's heartbeat, a worker's claim, a user's cancel or another sweep that got
there first makes it match no row, and the job is left to them. Sweeps may therefore overlap
(Celery beat, ``manage.py sweep_jobs``, a worker's start), and a second sweep changes nothing
more. A re-sent message that turns out to be a duplicate is harmless: `runner.claim_job` skips a
job that is not queued (or is running on a live worker).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from pathlib import Path

from django.conf import settings
from django.db.models import Q
from django.utils import timezone

from registry.jobs.broker import (
    BrokerUnavailable,
    broker_errors,
    new_task_id,
    ready_messages,
    send_job,
)
from registry.jobs.choices import JobState
from registry.jobs.models import AcquisitionJob
from registry.jobs.workdir import artifacts, log_tail

__all__ = [
    "Released",
    "SweepAction",
    "recover_jobs",
    "release_orphan",
    "silence_reason",
    "sweep_orphaned_jobs",
]

log = logging.getLogger(__name__)


class SweepAction(StrEnum):
    REQUEUED = "requeued"  # a running orphan, queued and sent again: it resumes from its samples
    FAILED = "failed"  # a running orphan started JOB_MAX_ATTEMPTS times: not sent again
    CANCELLED = "cancelled"  # a running orphan whose cancel nobody carried out
    RESENT = "resent"  # a queued job whose message was lost, sent again


@dataclass(frozen=True)
class Released:
    """What the sweep did (or, in a dry run, would do) to one job."""

    job_id: int
    action: SweepAction
    reason: str

    def __str__(self) -> str:
        return f"job {self.job_id}: {self.action} ({self.reason})"


def _utc(moment: datetime) -> str:
    return f"{moment.astimezone(UTC):%Y-%m-%d %H:%M:%S} UTC"


def silence_reason(job: AcquisitionJob) -> str:
    """Why a running job that nobody writes any more is taken to have lost its worker."""
    return (
        f"its worker {job.worker or '(unknown)'} stopped: no heartbeat since "
        f"{_utc(job.updated_at)} (more than REGISTRY_JOB_STALE_S="
        f"{settings.REGISTRY['JOB_STALE_S']} s)"
    )


def _decide(job: AcquisitionJob) -> SweepAction:
    if job.cancel_requested:
        return SweepAction.CANCELLED
    if job.attempts >= settings.REGISTRY["JOB_MAX_ATTEMPTS"]:
        return SweepAction.FAILED
    return SweepAction.REQUEUED


def release_orphan(job: AcquisitionJob, why: str, *, dry_run: bool = False) -> Released | None:
    """Re-send, fail or cancel a running ``job`` (as read) whose worker is gone.

    ``why`` says how the worker was found gone. Returns None when the row changed since it was
    read (its runner wrote a heartbeat, someone else released it): then nothing is done.
    """
    action = _decide(job)
    if dry_run:
        return Released(job.pk, action, why)
    row = AcquisitionJob.objects.as_read(job)
    if action == SweepAction.CANCELLED:
        changed = row.move(JobState.RUNNING, JobState.CANCELLED, phase="cancelled")
    elif action == SweepAction.FAILED:
        limit = settings.REGISTRY["JOB_MAX_ATTEMPTS"]
        error = (
            f"{why}; it was started {job.attempts} times (REGISTRY_JOB_MAX_ATTEMPTS="
            f"{limit}), so it is not sent again. Its samples are kept in "
            f"{job.work_dir or 'its work folder'}: a retry resumes from them"
        )
        work = Path(job.work_dir) if job.work_dir else None
        # The evidence is attached when the sweep runs where the work folder is.
        here = work is not None and work.is_dir()
        changed = row.move(
            JobState.RUNNING,
            JobState.FAILED,
            phase="failed",
            error=error,
            artifacts=artifacts(work, failed=True) if here and work else job.artifacts,
            log_tail=log_tail(work / "acquisition.log") if here and work else job.log_tail,
        )
    else:
        task_id = new_task_id()
        changed = row.move(
            JobState.RUNNING, JobState.QUEUED, phase="requeued", celery_task_id=task_id
        )
        job.celery_task_id = task_id
    if not changed:
        return None
    log.warning("job %s (%s): %s; %s", job.pk, job.queue, why, action)
    if action == SweepAction.REQUEUED:
        try:
            send_job(job)
        except BrokerUnavailable:
            # Queued without a message: the next sweep finds its message missing and sends it.
            log.exception("job %s: requeued, but the message could not be sent", job.pk)
    return Released(job.pk, action, why)


def _resend_lost(
    now: datetime, stale: datetime, queues: list[str] | None, dry_run: bool
) -> list[Released]:
    waiting = AcquisitionJob.objects.filter(state=JobState.QUEUED, updated_at__lt=stale)
    if queues is not None:
        waiting = waiting.filter(queue__in=queues)
    by_queue: dict[str, list[AcquisitionJob]] = {}
    for job in waiting.order_by("updated_at", "id"):
        by_queue.setdefault(job.queue, []).append(job)
    released = []
    for queue, jobs in sorted(by_queue.items()):
        queued = AcquisitionJob.objects.filter(state=JobState.QUEUED, queue=queue).count()
        try:
            ready = ready_messages(queue)
        except broker_errors() as exc:
            log.warning(
                "queue %s: the broker does not answer (%s); queued jobs not checked", queue, exc
            )
            continue
        if ready >= queued:
            continue  # every queued job can still have its message: no free worker yet
        for job in jobs:
            why = (
                f"queued since {_utc(job.updated_at)} while {queue} holds {ready} messages "
                f"for {queued} queued jobs: its message was lost"
            )
            if dry_run:
                released.append(Released(job.pk, SweepAction.RESENT, why))
                continue
            task_id = new_task_id()
            if not AcquisitionJob.objects.as_read(job).touch(
                celery_task_id=task_id, updated_at=now
            ):
                continue  # claimed, cancelled or re-sent meanwhile
            job.celery_task_id = task_id
            try:
                send_job(job)
            except BrokerUnavailable:
                log.exception("job %s: its lost message could not be sent again", job.pk)
                continue
            log.warning("job %s: %s; sent again", job.pk, why)
            released.append(Released(job.pk, SweepAction.RESENT, why))
    return released


def sweep_orphaned_jobs(
    queues: Iterable[str] | None = None, *, dry_run: bool = False
) -> list[Released]:
    """Release every orphaned job (of ``queues``, or of all queues); returns what was done.

    Safe to run at any time and from several processes at once (see the module docstring).
    """
    now = timezone.now()
    stale = now - timedelta(seconds=settings.REGISTRY["JOB_STALE_S"])
    chosen = list(queues) if queues is not None else None
    silent = AcquisitionJob.objects.filter(state=JobState.RUNNING, updated_at__lt=stale)
    if chosen is not None:
        silent = silent.filter(queue__in=chosen)
    released = []
    for job in silent.order_by("updated_at", "id"):
        done = release_orphan(job, silence_reason(job), dry_run=dry_run)
        if done is not None:
            released.append(done)
    released += _resend_lost(now, stale, chosen, dry_run)
    return released


def recover_jobs(worker: str, queues: Iterable[str]) -> list[int]:
    """Release the running jobs of ``queues`` whose worker died; returns the re-sent ids.

    Called when a worker starts: a job still marked running on this very node name cannot be
    running (the node was just started), and one nobody has written for JOB_STALE_S seconds has
    lost its worker. With Redis the original message would come back only after the visibility
    timeout (longer than the longest job); the embedded broker never brings it back. Each job
    is released as the periodic sweep releases it (`release_orphan`): re-sent, or failed after
    JOB_MAX_ATTEMPTS starts, or cancelled if that was asked.
    """
    stale = timezone.now() - timedelta(seconds=settings.REGISTRY["JOB_STALE_S"])
    orphans = (
        AcquisitionJob.objects.filter(state=JobState.RUNNING, queue__in=list(queues))
        .filter(Q(worker=worker) | Q(updated_at__lt=stale))
        .order_by("updated_at", "id")
    )
    recovered = []
    for job in orphans:
        why = (
            f"its worker {worker} restarted while running it"
            if job.worker == worker
            else silence_reason(job)
        )
        done = release_orphan(job, why)
        if done is not None and done.action == SweepAction.REQUEUED:
            recovered.append(job.pk)
    return recovered
