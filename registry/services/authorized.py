"""Job actions as a given person: the permission check, the action, and its record, in one
place for the API and the dashboard alike (issue 17, item 2).

`registry.jobs.services` does the work (state changes, broker); this layer decides whether the
person may (``registry.permissions``) and records who did it (``registry.audit``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from registry.audit import record_change
from registry.jobs.services import cancel_job, queue_job, retry_job
from registry.permissions import NotAllowed, can_cancel_job, can_queue_job, can_retry_job

if TYPE_CHECKING:
    from registry.jobs.models import AcquisitionJob

__all__ = ["NotAllowed", "cancel_job_as", "queue_job_as", "retry_job_as"]


def queue_job_as(user: Any, params: Mapping[str, Any]) -> AcquisitionJob:
    if not can_queue_job(user):
        raise NotAllowed("sign in (or send a token) to queue a job")
    job = queue_job(user, params)
    record_change(user, "job.queue", job, queue=job.queue)
    return job


def cancel_job_as(user: Any, job: AcquisitionJob) -> AcquisitionJob:
    if not can_cancel_job(user, job):
        raise NotAllowed("only the job's creator or staff may cancel it")
    done = cancel_job(job)
    record_change(user, "job.cancel", done, state=done.state)
    return done


def retry_job_as(user: Any, job: AcquisitionJob) -> AcquisitionJob:
    if not can_retry_job(user, job):
        raise NotAllowed("only the job's creator or staff may retry it")
    done = retry_job(job)
    record_change(user, "job.retry", done)
    return done
