"""Queue, cancel and retry acquisition jobs: what the API and the web form call.

Warehouse's rule: a task is sent only after the transaction that created its row commits, so
a worker never looks for a job that is not there yet. The broker is checked before the row is
made, so "the broker is down" is a clear refusal (503) instead of a job that never starts.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from functools import partial
from typing import TYPE_CHECKING, cast

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from registry.jobs.broker import BrokerUnavailable, check_broker, new_task_id, send_job
from registry.jobs.choices import PUBLISHING_PHASE, JobState
from registry.jobs.models import AcquisitionJob, JobStateError
from registry.jobs.parameters import queue_for, validate_parameters

if TYPE_CHECKING:
    from django.contrib.auth.models import AbstractBaseUser, AnonymousUser, User

__all__ = [
    "BrokerUnavailable",
    "JobStateError",
    "cancel_job",
    "check_broker",
    "is_stale",
    "new_task_id",
    "queue_job",
    "retry_job",
    "send_job",
]

log = logging.getLogger(__name__)


def _send_after_commit(job: AcquisitionJob) -> None:
    try:
        send_job(job)
    except BrokerUnavailable as exc:
        # The broker went away between the check and the send: the row says so, and the
        # caller gets the same 503 as if the check had failed.
        AcquisitionJob.objects.filter(pk=job.pk).move(
            JobState.QUEUED, JobState.FAILED, phase="failed", error=str(exc)
        )
        raise


def queue_job(user: AbstractBaseUser | AnonymousUser | None, params: object) -> AcquisitionJob:
    """Validate ``params`` like the CLI, create the job, and send it once the row is committed.

    Raises `JobParameterError` (``.errors``: ``{field: [message]}``) or `BrokerUnavailable`.
    """
    clean = validate_parameters(params)
    check_broker()
    # AUTH_USER_MODEL is Django's User; the request hands it over as its base class.
    owner = cast("User", user) if user is not None and user.is_authenticated else None
    with transaction.atomic():
        job = AcquisitionJob.objects.create(
            created_by=owner,
            parameters=clean,
            queue=queue_for(clean),
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
            current.move(JobState.CANCELLED, phase="cancelled")
        elif current.state == JobState.RUNNING and current.phase == PUBLISHING_PHASE:
            raise JobStateError(
                f"job {current.pk} has finished measuring and is publishing its "
                "bundle; it can no longer be cancelled"
            )
        elif current.state == JobState.RUNNING:
            current.cancel_requested = True
            current.save(update_fields=["cancel_requested"])
        else:
            raise JobStateError(
                f"job {current.pk} is {current.state}; only queued or running jobs can be cancelled"
            )
    return current


def retry_job(job: AcquisitionJob) -> AcquisitionJob:
    """Queue a failed or cancelled job again; the worker resumes from its own samples."""
    if job.state not in (JobState.FAILED, JobState.CANCELLED):
        raise JobStateError(
            f"job {job.pk} is {job.state}; only failed or cancelled jobs can be retried"
        )
    check_broker()
    with transaction.atomic():
        current = AcquisitionJob.objects.select_for_update().get(pk=job.pk)
        if current.state not in (JobState.FAILED, JobState.CANCELLED):
            raise JobStateError(f"job {current.pk} is {current.state}")
        # updated_at (set by the move): when it was queued again; the orphan sweep measures a
        # wait from it.
        current.move(
            JobState.QUEUED,
            phase="queued",
            cancel_requested=False,
            error="",
            finished_at=None,
            celery_task_id=new_task_id(),
        )
        transaction.on_commit(partial(_send_after_commit, current))
    return current
