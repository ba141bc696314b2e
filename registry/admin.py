from __future__ import annotations

from django.contrib import admin

from registry.models import Bundle, DeploymentTable


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
