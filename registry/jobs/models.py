"""An acquisition job: what to measure, where it runs, how far it got, what it published.

The row is the job's whole state: the Celery message carries only its id, so a message that
is delivered twice, or again after a worker died, finds the truth here (see runner.claim_job).

Every change of state goes through this module: `JobQuerySet.move` (a conditional UPDATE, for
the writers that race: runner, sweep, services) and `AcquisitionJob.move` (on a row the caller
has locked or just read). Both ask `check_move`, the one place that knows which moves are legal.
"""

from __future__ import annotations

import shlex
from typing import Any

from django.conf import settings
from django.db import models
from django.utils import timezone

from registry.jobs.choices import ACTIVE_STATES, FINISHED_STATES, LEGAL_MOVES, JobState

__all__ = ["AcquisitionJob", "JobQuerySet", "JobStateError", "check_move"]


class JobStateError(ValueError):
    """The job's state does not allow the operation (cancel a finished job, retry a queued one)."""


def check_move(source: str, target: str) -> None:
    """Raise `JobStateError` unless ``source -> target`` is one of `LEGAL_MOVES`."""
    if JobState(target) not in LEGAL_MOVES[JobState(source)]:
        raise JobStateError(f"a job cannot go from {source} to {target}")


def _move_values(target: JobState, phase: str, fields: dict[str, Any]) -> dict[str, Any]:
    """The columns of a move: state, phase, heartbeat, and what a final or new state implies."""
    now = timezone.now()
    values: dict[str, Any] = {"state": target, "phase": phase, "updated_at": now}
    if target in FINISHED_STATES:
        values.update(finished_at=now, eta_seconds=None)
    elif target == JobState.QUEUED:
        values.update(eta_seconds=None)
    values.update(fields)
    return values


class JobQuerySet(models.QuerySet["AcquisitionJob"]):
    def attempt(self, job: AcquisitionJob) -> JobQuerySet:
        """The job's row, only while it is still the runner's attempt ``job.attempts``."""
        return self.filter(pk=job.pk, state=JobState.RUNNING, attempts=job.attempts)

    def as_read(self, job: AcquisitionJob) -> JobQuerySet:
        """The job's row, only while nobody has written it since ``job`` was read."""
        return self.filter(
            pk=job.pk, state=job.state, attempts=job.attempts, updated_at=job.updated_at
        )

    def move(self, source: JobState, target: JobState, *, phase: str, **fields: Any) -> int:
        """Move the rows still in ``source`` to ``target``; returns how many moved.

        A conditional UPDATE: a row another writer changed first matches nothing, so racing
        writers (a runner's heartbeat, a sweep, a cancel) never undo each other.
        """
        check_move(source, target)
        return self.filter(state=source).update(**_move_values(target, phase, fields))

    def touch(self, **fields: Any) -> int:
        """Write progress columns and the heartbeat, never the state (that is `move`)."""
        if "state" in fields:
            raise JobStateError("a state change is a move(), not a touch()")
        fields.setdefault("updated_at", timezone.now())
        return self.update(**fields)


class AcquisitionJob(models.Model):
    objects = JobQuerySet.as_manager()

    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="acquisition_jobs",
    )
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(auto_now=True, help_text="heartbeat while running")
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    state = models.CharField(max_length=16, choices=JobState.choices, default=JobState.QUEUED)
    phase = models.CharField(max_length=32, default="queued")
    points_done = models.PositiveIntegerField(default=0)
    points_total = models.PositiveIntegerField(default=0)
    eta_seconds = models.FloatField(null=True, blank=True)
    log_tail = models.TextField(blank=True)
    error = models.TextField(blank=True)
    parameters = models.JSONField(help_text="validated acquisition parameters, defaults filled")
    queue = models.CharField(max_length=128, help_text="gpu.<hardware>, or cpu")
    result_bundle = models.ForeignKey(
        "registry.Bundle",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="acquisition_jobs",
    )
    work_dir = models.CharField(max_length=1024, blank=True)
    artifacts = models.JSONField(default=list, blank=True, help_text="[{name, path, size}]")
    attempts = models.PositiveIntegerField(default=0)
    cancel_requested = models.BooleanField(default=False)
    worker = models.CharField(max_length=255, blank=True, help_text="Celery node name")
    celery_task_id = models.CharField(max_length=64, blank=True)

    class Meta:
        ordering = ("-created_at", "-id")
        indexes = (
            models.Index(fields=["state", "queue"]),
            models.Index(fields=["-created_at", "-id"]),
        )

    def __str__(self) -> str:
        model = self.parameters.get("model", "?")
        return f"job {self.pk}: {model} on {self.parameters.get('hardware', '?')} ({self.state})"

    def move(self, target: JobState, *, phase: str, **fields: Any) -> None:
        """Move this row (locked or just read by the caller) to ``target`` and save it."""
        check_move(self.state, target)
        values = _move_values(target, phase, fields)
        for name, value in values.items():
            setattr(self, name, value)
        self.save(update_fields=list(values))

    @property
    def is_active(self) -> bool:
        return self.state in ACTIVE_STATES

    @property
    def is_finished(self) -> bool:
        return self.state in FINISHED_STATES

    @property
    def progress_fraction(self) -> float | None:
        if not self.points_total:
            return None
        return min(1.0, self.points_done / self.points_total)

    @property
    def command_line(self) -> str:
        """The acquisition command the worker runs (paths as on the worker host)."""
        from registry.jobs.parameters import acquisition_argv

        out_root = f"{self.work_dir or '<work_dir>'}/out"
        argv = acquisition_argv(self.parameters, out_root=out_root)
        return shlex.join(["python", "-m", "acquisition", *argv])
