"""Requests for missing coverage cells, and the workers the registry has seen per queue."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.utils import timezone

__all__ = ["CoverageRequest", "WorkerPresence"]


class CoverageRequest(models.Model):
    """A user's ask for a table that the coverage matrix shows as a gap.

    One open request per cell (a second ask adds its user to ``requesters``); it is queued as an
    acquisition job when a worker of the hardware's queue is online, and closed by the job that
    publishes the cell.
    """

    class State(models.TextChoices):
        OPEN = "open", "open: no worker for this hardware yet"
        QUEUED = "queued", "queued as a job"
        CLOSED = "closed", "closed: the table is published"

    hardware = models.CharField(max_length=128)
    model = models.CharField(max_length=256)
    variant = models.CharField(max_length=128)
    backend = models.CharField(max_length=128)
    tp = models.PositiveSmallIntegerField()
    dp = models.PositiveSmallIntegerField()
    ep = models.PositiveSmallIntegerField()
    rank = models.PositiveSmallIntegerField()
    sequence_parallel = models.BooleanField()
    state = models.CharField(max_length=8, choices=State.choices, default=State.OPEN)
    requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )
    requesters = models.ManyToManyField(settings.AUTH_USER_MODEL, related_name="+")
    created_at = models.DateTimeField(default=timezone.now)
    closed_at = models.DateTimeField(null=True, blank=True)
    job = models.ForeignKey(
        "registry.AcquisitionJob",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="coverage_requests",
    )

    class Meta:
        ordering = ("-created_at", "-id")
        constraints = (
            models.UniqueConstraint(
                fields=[
                    "hardware",
                    "model",
                    "variant",
                    "backend",
                    "tp",
                    "dp",
                    "rank",
                    "sequence_parallel",
                ],
                condition=~models.Q(state="closed"),
                name="registry_one_open_request_per_cell",
            ),
        )

    @property
    def cell(self) -> tuple[object, ...]:
        return (
            self.hardware,
            self.model,
            self.variant,
            self.backend,
            self.tp,
            self.dp,
            self.ep,
            self.rank,
            self.sequence_parallel,
        )

    @property
    def deployment(self) -> str:
        return (
            f"tp{self.tp} dp{self.dp}_ep{self.ep}_rank{self.rank}_sp{int(self.sequence_parallel)}"
        )


class WorkerPresence(models.Model):
    """A Celery worker node and the queues it consumes, stamped while it runs."""

    node = models.CharField(max_length=255, unique=True)
    queues = models.JSONField(default=list)
    last_seen = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ("node",)
