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

# The runner's phase while it publishes the finished bundle: past this point a cancel is refused.
PUBLISHING_PHASE = "registry-publish"
