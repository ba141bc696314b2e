"""Closed vocabularies of acquisition jobs."""

from __future__ import annotations

from django.db import models


class JobState(models.TextChoices):
    QUEUED = "queued", "queued"
    RUNNING = "running", "running"
    SUCCEEDED = "succeeded", "succeeded"
    FAILED = "failed", "failed"
    CANCELLED = "cancelled", "cancelled"


ACTIVE_STATES = (JobState.QUEUED, JobState.RUNNING)
FINISHED_STATES = (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED)

# The one table of legal state changes (registry.jobs.models.check_move asks it):
# queued -> running (a worker claims it), cancelled (cancel), failed (its message could not
# be sent); running -> running (claimed again after its worker was lost), queued (re-sent by
# the sweep), succeeded, failed, cancelled; failed or cancelled -> queued (retry).
LEGAL_MOVES: dict[JobState, frozenset[JobState]] = {
    JobState.QUEUED: frozenset({JobState.RUNNING, JobState.CANCELLED, JobState.FAILED}),
    JobState.RUNNING: frozenset(
        {JobState.RUNNING, JobState.QUEUED, JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED}
    ),
    JobState.SUCCEEDED: frozenset(),
    JobState.FAILED: frozenset({JobState.QUEUED}),
    JobState.CANCELLED: frozenset({JobState.QUEUED}),
}

# The runner's phase while it publishes the finished bundle: past this point a cancel is refused.
PUBLISHING_PHASE = "registry-publish"
