"""Published routing profiles (`moetables.profiles`): one validated ``.npz`` each, stored as a
content-addressed blob; the row keeps what a listing and the profile page need."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.db import models
from django.utils import timezone

__all__ = ["RoutingProfileRecord"]


class RoutingProfileRecord(models.Model):
    sha256 = models.CharField(max_length=64, unique=True, help_text="sha256 of the .npz file")
    size = models.PositiveBigIntegerField()
    model = models.CharField(max_length=200)
    router = models.CharField(max_length=200)
    source = models.CharField(max_length=64)
    global_experts = models.PositiveIntegerField()
    top_k = models.PositiveIntegerField()
    layers = models.PositiveIntegerField(help_text="captured MoE layers")
    steps = models.PositiveIntegerField()
    tokens = models.PositiveBigIntegerField(help_text="rows routed over all steps")
    captured_at = models.CharField(max_length=64)
    summary: models.JSONField[Any] = models.JSONField(help_text="moetables profile summary")
    filename = models.CharField(max_length=255, blank=True)
    published_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )
    published_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ("-published_at", "-id")

    def __str__(self) -> str:
        return f"routing profile #{self.pk} {self.model} ({self.router})"
