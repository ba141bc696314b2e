"""API shapes. Lists stay light (no contracts, no manifests); details carry everything."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

from django.urls import reverse
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from registry.bundles.models import Bundle, DeploymentTable

__all__ = [
    "SUMMARY_FIELDS",
    "BundleDetailSerializer",
    "BundleSerializer",
    "DeploymentTableSerializer",
    "TargetSerializer",
    "UploadResponseSerializer",
    "UploadSerializer",
]


class TargetSerializer(serializers.Serializer[Any]):
    """A deployment rank (documentation: moetables.lookup.queries checks lookup targets)."""

    tp = serializers.IntegerField(min_value=1)
    dp = serializers.IntegerField(min_value=1)
    ep = serializers.IntegerField(min_value=1, required=False, help_text="tp*dp when given")
    rank = serializers.IntegerField(min_value=0, help_text="below ep")
    sequence_parallel = serializers.BooleanField(default=False)


class SupportSerializer(serializers.Serializer[Any]):
    tokens = serializers.ListField(child=serializers.IntegerField(allow_null=True))
    activated_experts = serializers.ListField(child=serializers.IntegerField(allow_null=True))
    local_assignments = serializers.ListField(child=serializers.IntegerField(allow_null=True))
    local_tokens = serializers.ListField(child=serializers.IntegerField(allow_null=True))


class DeploymentTableBriefSerializer(serializers.ModelSerializer[DeploymentTable]):
    deployment = serializers.SerializerMethodField()

    class Meta:
        model = DeploymentTable
        fields = (
            "deployment",
            "tp",
            "dp",
            "ep",
            "rank",
            "sequence_parallel",
            "backend",
            "kernel",
            "native",
            "vllm_version",
        )

    def get_deployment(self, table: DeploymentTable) -> str:
        return str(table)


class DeploymentTableSerializer(serializers.ModelSerializer[DeploymentTable]):
    target = serializers.SerializerMethodField()
    support = serializers.SerializerMethodField()
    url = serializers.SerializerMethodField()
    expert_loads = serializers.SerializerMethodField(
        help_text="issue 18: the expert rows' load distribution (balanced) and, from bundle "
        "format 3, the table's fitted row-tile model (tile_model.tile_cost_us: the cost a "
        "lookup's load description is charged at when the query names none); from format 4, "
        "tile_models: one such cost per vLLM block size (block_m), each charged exactly there; "
        "from format 5 an item may be a wave model (schema row-waves-per-block-v1: wave_cost_us "
        "per weighted wave of the expert kernel's grid, programs_per_sm, sms) instead"
    )

    class Meta:
        model = DeploymentTable
        fields = (
            "target",
            "table_path",
            "url",
            "table_sha256",
            "components",
            "modes",
            "backend",
            "kernel",
            "native",
            "vllm_version",
            "measured_at",
            "row_count",
            "support",
            "contract_id",
            "contract",
            "coverage",
            "expert_loads",
        )

    def get_expert_loads(self, table: DeploymentTable) -> dict[str, Any]:
        from registry.bundles.services.describe import expert_loads_of_meta

        return expert_loads_of_meta(table.bundle.meta, table.target)

    @extend_schema_field(TargetSerializer)
    def get_target(self, table: DeploymentTable) -> dict[str, Any]:
        return table.target

    @extend_schema_field(SupportSerializer)
    def get_support(self, table: DeploymentTable) -> dict[str, list[int | None]]:
        """Measured [min, max] of N, A, M over expert rows and of the local components' rows."""
        return {
            "tokens": [table.tokens_min, table.tokens_max],
            "activated_experts": [table.activated_experts_min, table.activated_experts_max],
            "local_assignments": [table.local_assignments_min, table.local_assignments_max],
            "local_tokens": [table.local_tokens_min, table.local_tokens_max],
        }

    def get_url(self, table: DeploymentTable) -> str:
        return _file_url(self.context, table.bundle_id, table.table_path)


def _absolute(context: Mapping[str, Any], path: str) -> str:
    request = context.get("request")
    return request.build_absolute_uri(path) if request is not None else path


def _file_url(context: Mapping[str, Any], bundle_id: int, path: str) -> str:
    url = reverse("registry-api:bundle-files", kwargs={"pk": bundle_id, "path": "-"})
    return _absolute(context, url.removesuffix("-") + quote(path))


class BundleSerializer(serializers.ModelSerializer[Bundle]):
    url = serializers.HyperlinkedIdentityField(view_name="registry-api:bundle-detail")
    download_url = serializers.SerializerMethodField()
    tables = DeploymentTableBriefSerializer(many=True, read_only=True)

    class Meta:
        model = Bundle
        fields: tuple[str, ...] = (
            "id",
            "url",
            "sha256",
            "hardware",
            "model",
            "variant",
            "layout",
            "vllm_version",
            "size",
            "file_count",
            "measured_at",
            "published_at",
            "source",
            "download_url",
            "tables",
            "exploratory",
        )

    def get_download_url(self, bundle: Bundle) -> str:
        url = reverse("registry-api:bundle-download", kwargs={"pk": bundle.pk})
        return _absolute(self.context, url)


SUMMARY_FIELDS = (
    "id",
    "sha256",
    "hardware",
    "model",
    "variant",
    "layout",
    "vllm_version",
    "size",
    "file_count",
    "measured_at",
    "published_at",
    "source",
    "targets",
    "exploratory",
)


def _iso(value: dt.datetime | None) -> str | None:
    """As DRF's DateTimeField writes it (UTC, ``Z``)."""
    if value is None:
        return None
    text = value.astimezone(dt.UTC).isoformat()
    return text[:-6] + "Z" if text.endswith("+00:00") else text


def bundle_summaries(rows: list[dict[str, Any]], request: Any) -> list[dict[str, Any]]:
    """What BundleSerializer gives for ``rows`` (``Bundle.objects.values(*SUMMARY_FIELDS)``).

    Built by hand because a list page may hold 1,000 bundles and DRF's per-field machinery
    costs about half a millisecond per bundle with its tables; a test checks both agree.
    """
    detail = reverse("registry-api:bundle-detail", kwargs={"pk": 1})
    prefix = _absolute({"request": request}, detail)[:-1]
    return [
        {
            "id": row["id"],
            "url": f"{prefix}{row['id']}",
            "sha256": row["sha256"],
            "hardware": row["hardware"],
            "model": row["model"],
            "variant": row["variant"],
            "layout": row["layout"],
            "vllm_version": row["vllm_version"],
            "size": row["size"],
            "file_count": row["file_count"],
            "measured_at": _iso(row["measured_at"]),
            "published_at": _iso(row["published_at"]),
            "source": row["source"],
            "download_url": f"{prefix}{row['id']}/download",
            "tables": row["targets"],
            "exploratory": row["exploratory"],
        }
        for row in rows
    ]


class FileSerializer(serializers.Serializer[Any]):
    path = serializers.CharField()
    size = serializers.IntegerField()
    sha256 = serializers.CharField()
    url = serializers.CharField()


class BundleDetailSerializer(BundleSerializer):
    tables = DeploymentTableSerializer(many=True, read_only=True)  # type: ignore[assignment]
    files = serializers.SerializerMethodField()
    published_by: serializers.SlugRelatedField[Any] = serializers.SlugRelatedField(
        slug_field="username", read_only=True, allow_null=True
    )

    class Meta(BundleSerializer.Meta):
        fields = (
            *BundleSerializer.Meta.fields,
            "source_detail",
            "published_by",
            "missing_files",
            "files",
            "meta",
        )

    @extend_schema_field(FileSerializer(many=True))
    def get_files(self, bundle: Bundle) -> list[dict[str, Any]]:
        return [
            {**record, "url": _file_url(self.context, bundle.pk, record["path"])}
            for record in bundle.manifest
        ]


class UploadSerializer(serializers.Serializer[Any]):
    archive = serializers.FileField(help_text="the bundle as .tar.gz or .zip")


class UploadResponseSerializer(BundleDetailSerializer):
    created = serializers.BooleanField(read_only=True)
    left_out = serializers.ListField(child=serializers.CharField(), read_only=True)
    left_out_reasons = serializers.ListField(
        child=serializers.CharField(),
        read_only=True,
        help_text="'path: left out: why' for each file the registry did not store",
    )

    class Meta(BundleDetailSerializer.Meta):
        fields = (*BundleDetailSerializer.Meta.fields, "created", "left_out", "left_out_reasons")
