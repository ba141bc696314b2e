"""Who changed what: one row per state change a person (or the worker) made (issue 17, item 2).

The registry's objects keep their own current state (a job's ``state``, a bundle's
``published_by``); this log keeps every change with its author, so that "who cancelled my job"
and "who granted this namespace" have an answer after the fact.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.db import models
from django.utils import timezone

__all__ = ["StateChange", "record_change"]


class StateChange(models.Model):
    at = models.DateTimeField(default=timezone.now)
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
        help_text="who made the change; empty for the worker or a command",
    )
    # The name as it was, so the record outlives a deleted account.
    actor_name = models.CharField(max_length=150, blank=True)
    action = models.CharField(max_length=64, help_text="e.g. job.cancel, bundle.publish")
    target_type = models.CharField(max_length=32)
    target_id = models.BigIntegerField()
    detail = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ("-at", "-id")
        indexes = (models.Index(fields=["target_type", "target_id", "-at"]),)

    def __str__(self) -> str:
        who = self.actor_name or "system"
        return (
            f"{self.at:%Y-%m-%d %H:%M:%S} {who} {self.action} {self.target_type} {self.target_id}"
        )


def record_change(actor: Any, action: str, target: models.Model, **detail: Any) -> StateChange:
    """Record that ``actor`` (a user, or None) did ``action`` to ``target``."""
    user = actor if getattr(actor, "is_authenticated", False) else None
    return StateChange.objects.create(
        actor=user,
        actor_name=user.get_username() if user is not None else "",
        action=action,
        target_type=target._meta.model_name or type(target).__name__.lower(),
        target_id=target.pk,
        detail=detail,
    )
