"""Names belong to publishers (issue 17, item 7).

A hardware/model pair is a namespace. The first person to publish under it owns it; staff can
grant others the right to publish there too. Lookups by name then answer only what the
namespace's owner and grantees published, so a stranger cannot change what a name resolves to.
"""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.utils import timezone

__all__ = ["Namespace", "NamespaceGrant"]


class Namespace(models.Model):
    hardware = models.CharField(max_length=128)
    model = models.CharField(max_length=256)
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="owned_namespaces",
        help_text="empty: claimed by an import or a job, so only staff and grantees publish",
    )
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = (
            models.UniqueConstraint(fields=["hardware", "model"], name="registry_one_namespace"),
        )

    def __str__(self) -> str:
        return f"{self.hardware} {self.model}"


class NamespaceGrant(models.Model):
    namespace = models.ForeignKey(Namespace, on_delete=models.CASCADE, related_name="grants")
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="namespace_grants"
    )
    granted_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
    )
    granted_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = (
            models.UniqueConstraint(fields=["namespace", "user"], name="registry_one_grant"),
        )

    def __str__(self) -> str:
        return f"{self.user} may publish under {self.namespace}"
