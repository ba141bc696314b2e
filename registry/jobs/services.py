"""Queue, cancel and retry acquisition jobs: what the API and the web form call.

Warehouse's rule: a task is sent only after the transaction that created its row commits, so
a worker never looks for a job that is not there yet. The broker is checked before the row is
made, so "the broker is down" is a clear refusal (503) instead of a job that never starts.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from datetime import timedelta
from functools import partial
from typing import TYPE_CHECKING, Any
from uuid import uuid4

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from registry.jobs.choices import PUBLISHING_PHASE, JobState
from registry.jobs.models import AcquisitionJob
from registry.jobs.parameters import queue_for, validate_parameters

if TYPE_CHECKING:
    from django.contrib.auth.models import AbstractBaseUser, AnonymousUser

__all__ = [
    "BrokerUnavailable",
    "JobStateError",
    "cancel_job",
    "check_broker",
    "new_task_id",
    "queue_job",
    "retry_job",
    "send_job",
]

log = logging.getLogger(__name__)


class BrokerUnavailable(RuntimeError):
    """The Celery broker does not answer; nothing was queued."""


class JobStateError(ValueError):
    """The job's state does not allow the operation (cancel a finished job, retry a queued one)."""


def _broker_errors() -> tuple[type[BaseException], ...]:
    from kombu.exceptions import OperationalError

    return (OperationalError, OSError, ConnectionError, TimeoutError)


def check_broker() -> None:
    """Raise `BrokerUnavailable` unless the broker accepts a connection now (no retries)."""
    from config.celery import app, ensure_broker_folders

    try:
        ensure_broker_folders()
        with app.connection_for_write() as connection:
            connection.ensure_connection(max_retries=1, interval_start=0, timeout=3)
    except _broker_errors() as exc:
        raise BrokerUnavailable(f"the job queue (Celery broker) does not answer: {exc}") from exc


def new_task_id() -> str:
    """The id of the next message for a job, stored in the row before the message is sent."""
    return str(uuid4())


def send_job(job: AcquisitionJob) -> str:
    """Send the job's message to its queue under ``job.celery_task_id``; returns that id.

    The id is written with the state change that the message stands for (queue, retry,
    requeue), so nothing writes the row after the message leaves: a worker may claim the job
    the moment it is sent, and a write here would race with (on SQLite: wait behind) its claim.
    """
    from config.celery import app, ensure_broker_folders
    from registry.tasks import run_acquisition_job

    task_id = job.celery_task_id or new_task_id()
    try:
        ensure_broker_folders()
        with app.connection_for_write() as connection:
            connection.ensure_connection(max_retries=1, interval_start=0, timeout=3)
            run_acquisition_job.apply_async(
                (job.pk,), queue=job.queue, connection=connection, retry=False,
                task_id=task_id,
            )
    except _broker_errors() as exc:
        raise BrokerUnavailable(f"the job queue (Celery broker) does not answer: {exc}") from exc
    job.celery_task_id = task_id
    return task_id


def _send_after_commit(job: AcquisitionJob) -> None:
    try:
        send_job(job)
    except BrokerUnavailable as exc:
        # The broker went away between the check and the send: the row says so, and the
        # caller gets the same 503 as if the check had failed.
        now = timezone.now()
        AcquisitionJob.objects.filter(pk=job.pk, state=JobState.QUEUED).update(
            state=JobState.FAILED, phase="failed", error=str(exc), finished_at=now,
            updated_at=now,
        )
        raise


def queue_job(
    user: AbstractBaseUser | AnonymousUser | None, params: Mapping[str, Any]
) -> AcquisitionJob:
    """Validate ``params`` like the CLI, create the job, and send it once the row is committed.

    Raises `JobParameterError` (``.errors``: ``{field: [message]}``) or `BrokerUnavailable`.
    """
    clean = validate_parameters(params)
    check_broker()
    owner = user if user is not None and user.is_authenticated else None
    with transaction.atomic():
        job = AcquisitionJob.objects.create(
            created_by=owner, parameters=clean, queue=queue_for(clean),
            celery_task_id=new_task_id(),
        )
        transaction.on_commit(partial(_send_after_commit, job))
    return job


def is_stale(job: AcquisitionJob) -> bool:
    """A running job whose worker has not written it for JOB_STALE_S seconds is orphaned."""
    limit = timedelta(seconds=settings.REGISTRY["JOB_STALE_S"])
    return job.state == JobState.RUNNING and job.updated_at < timezone.now() - limit


def cancel_job(job: AcquisitionJob) -> AcquisitionJob:
    """Cancel a queued job now; ask the worker of a running job to stop its subprocess.

    The subprocess is stopped with SIGTERM, which the acquisition treats as cancellation: its
    samples stay in the job's work folder and `retry_job` resumes from them. An accepted
    request always wins over publishing: the runner starts publishing only with a conditional
    update that finds ``cancel_requested`` unset (runner.begin_publishing), and once it has
    started, this refuses. A job whose worker is gone (`is_stale`) is cancelled at once.
    """
    with transaction.atomic():
        current = AcquisitionJob.objects.select_for_update().get(pk=job.pk)
        if current.state == JobState.QUEUED or is_stale(current):
            current.state = JobState.CANCELLED
            current.phase = "cancelled"
            current.finished_at = timezone.now()
            current.eta_seconds = None
            current.save(update_fields=["state", "phase", "finished_at", "eta_seconds",
                                        "updated_at"])
        elif current.state == JobState.RUNNING and current.phase == PUBLISHING_PHASE:
            raise JobStateError(f"job {current.pk} has finished measuring and is publishing its "
                                "bundle; it can no longer be cancelled")
        elif current.state == JobState.RUNNING:
            current.cancel_requested = True
            current.save(update_fields=["cancel_requested"])
        else:
            raise JobStateError(f"job {current.pk} is {current.state}; only queued or running "
                                "jobs can be cancelled")
    return current


def retry_job(job: AcquisitionJob) -> AcquisitionJob:
    """Queue a failed or cancelled job again; the worker resumes from its own samples."""
    if job.state not in (JobState.FAILED, JobState.CANCELLED):
        raise JobStateError(f"job {job.pk} is {job.state}; only failed or cancelled jobs can "
                            "be retried")
    check_broker()
    with transaction.atomic():
        current = AcquisitionJob.objects.select_for_update().get(pk=job.pk)
        if current.state not in (JobState.FAILED, JobState.CANCELLED):
            raise JobStateError(f"job {current.pk} is {current.state}")
        current.state = JobState.QUEUED
        current.phase = "queued"
        current.cancel_requested = False
        current.error = ""
        current.finished_at = None
        current.celery_task_id = new_task_id()
        # updated_at: when it was queued again (the orphan sweep measures a wait from it).
        current.save(update_fields=["state", "phase", "cancel_requested", "error",
                                    "finished_at", "celery_task_id", "updated_at"])
        transaction.on_commit(partial(_send_after_commit, current))
    return current
