"""An acquisition job: what to measure, where it runs, how far it got, what it published.

The row is the job's whole state: the Celery message carries only its id, so a message that
is delivered twice, or again after a worker died, finds the truth here (see runner.claim_job).
"""

from __future__ import annotations

import shlex

from django.conf import settings
from django.db import models
from django.utils import timezone

from registry.jobs.choices import ACTIVE_STATES, FINISHED_STATES, JobState

__all__ = ["AcquisitionJob"]


class AcquisitionJob(models.Model):
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
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
        "registry.Bundle", null=True, blank=True, on_delete=models.SET_NULL,
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
