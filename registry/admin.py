from __future__ import annotations

from typing import Any

from django.contrib import admin

from registry.audit import record_change
from registry.models import Bundle, DeploymentTable, Namespace, NamespaceGrant, StateChange
from registry.permissions import can_delete_bundle


# Not subscripted: Django's admin classes are generic only in django-stubs (a dev tool), and a
# base class is evaluated at run time.
class DeploymentTableInline(admin.TabularInline):  # type: ignore[type-arg]
    model = DeploymentTable
    fields = ("tp", "dp", "ep", "rank", "sequence_parallel", "backend", "row_count", "table_path")
    readonly_fields = fields
    extra = 0
    can_delete = False


@admin.register(Bundle)
class BundleAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = ("id", "hardware", "model", "variant", "layout", "vllm_version", "published_at")
    list_filter = ("hardware", "layout", "source")
    search_fields = ("hardware", "model", "variant", "sha256")
    readonly_fields = tuple(f.name for f in Bundle._meta.fields)
    inlines = (DeploymentTableInline,)

    def has_add_permission(self, request: object) -> bool:
        return False  # bundles enter through publish_bundle only

    def has_delete_permission(self, request: Any, obj: Bundle | None = None) -> bool:
        return can_delete_bundle(request.user, obj)


@admin.register(StateChange)
class StateChangeAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = ("at", "actor_name", "action", "target_type", "target_id")
    list_filter = ("action", "target_type")
    readonly_fields = tuple(f.name for f in StateChange._meta.fields)

    def has_add_permission(self, request: object) -> bool:
        return False

    def has_change_permission(self, request: object, obj: object = None) -> bool:
        return False


class NamespaceGrantInline(admin.TabularInline):  # type: ignore[type-arg]
    model = NamespaceGrant
    fields = ("user", "granted_by", "granted_at")
    readonly_fields = ("granted_by", "granted_at")
    extra = 0


@admin.register(Namespace)
class NamespaceAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    """Staff grant others the right to publish under a hardware/model (issue 17, item 7)."""

    list_display = ("hardware", "model", "owner", "created_at")
    search_fields = ("hardware", "model", "owner__username")
    inlines = (NamespaceGrantInline,)

    def save_formset(self, request: Any, form: Any, formset: Any, change: bool) -> None:
        grants = formset.save(commit=False)
        for grant in grants:
            grant.granted_by = request.user
            grant.save()
            record_change(
                request.user, "namespace.grant", grant.namespace, user=grant.user.get_username()
            )
        for gone in formset.deleted_objects:
            record_change(
                request.user, "namespace.revoke", gone.namespace, user=gone.user.get_username()
            )
            gone.delete()
