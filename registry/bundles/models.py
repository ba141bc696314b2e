"""A published bundle and the deployment tables it holds.

Rows are written only by `registry.bundles.services.publish.publish_bundle`, from a bundle that
`moetables` validated; the files themselves live in content-addressed storage and the
manifest here says which blob each path is.
"""

from __future__ import annotations

import re
from typing import Any

from django.conf import settings
from django.db import models
from django.utils import timezone

from registry.checks import MEASURED_AT_RANGE
from registry.choices import BundleLayout, BundleSource
from registry.manifest import Manifest

__all__ = ["Bundle", "DeploymentTable"]

_UNSAFE_NAME = re.compile(r"[^A-Za-z0-9._-]+")


class Bundle(models.Model):
    sha256 = models.CharField(
        max_length=64, unique=True, help_text="sha256 of the canonical manifest of every file"
    )
    hardware = models.CharField(max_length=128)
    model = models.CharField(max_length=256)
    variant = models.CharField(max_length=128)
    layout = models.CharField(max_length=16, choices=BundleLayout.choices)
    size = models.BigIntegerField(help_text="bytes of all files")
    file_count = models.PositiveIntegerField()
    manifest = models.JSONField(help_text="[{path, size, sha256}] sorted by path")
    meta = models.JSONField(help_text="the parsed root meta.yaml")
    missing_files = models.JSONField(
        default=list, help_text="files meta.yaml names that the bundle does not hold"
    )
    # A copy of each table's target and backend, so that a list page is one query (bundles
    # never change after publication, so the copy cannot go stale).
    targets = models.JSONField(default=list, help_text="brief tables, as the list shows them")
    vllm_version = models.CharField(max_length=64, blank=True)
    exploratory = models.BooleanField(
        default=False,
        help_text="a table was measured with a B/2B tolerance above the method's 3 %; "
        "name lookups skip it unless asked",
    )
    measured_at = models.DateTimeField(null=True, blank=True)
    published_at = models.DateTimeField(default=timezone.now)
    source = models.CharField(max_length=16, choices=BundleSource.choices)
    source_detail = models.CharField(
        max_length=512, blank=True, help_text="upload file name, imported path or job id"
    )
    published_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
    )

    class Meta:
        ordering = ("-published_at", "-id")
        # The database itself refuses a time that cannot be read back (year 0 or 10000 after
        # conversion to UTC answered 500 on every page that listed it; issue 17, item 3).
        constraints = (
            models.CheckConstraint(
                condition=models.Q(measured_at__isnull=True)
                | models.Q(
                    measured_at__gte=MEASURED_AT_RANGE[0], measured_at__lt=MEASURED_AT_RANGE[1]
                ),
                name="registry_bundle_measured_at_in_range",
            ),
        )
        indexes = (
            models.Index(fields=["hardware", "model", "variant", "-published_at"]),
            models.Index(fields=["model"]),
            models.Index(fields=["vllm_version"]),
            models.Index(fields=["-published_at", "-id"]),
        )

    def __str__(self) -> str:
        return f"{self.hardware} {self.model} {self.variant} ({self.sha256[:12]})"

    @property
    def backends(self) -> list[str]:
        """The execution paths (adapters) of its tables, in table order, each once."""
        found = [str(t.get("backend") or "") for t in self.targets if isinstance(t, dict)]
        return [b for b in dict.fromkeys(found) if b]

    @property
    def archive_stem(self) -> str:
        """A readable, filesystem-safe name for downloads:
        hardware_model_variant_backend_sha12 (backends joined by ``+``; omitted if unknown)."""
        parts = [self.hardware, self.model.replace("/", "--"), self.variant]
        if self.backends:
            parts.append("+".join(self.backends))
        parts.append(self.sha256[:12])
        return "_".join(_UNSAFE_NAME.sub("-", part).strip("-") or "x" for part in parts)

    def get_manifest(self) -> Manifest:
        return Manifest.from_dicts(self.manifest)

    def file_record(self, path: str) -> dict[str, Any] | None:
        for record in self.manifest:
            if record["path"] == path:
                return dict(record)
        return None


class DeploymentTable(models.Model):
    """One deployment rank's components.csv as the bundle declares it."""

    bundle = models.ForeignKey(Bundle, on_delete=models.CASCADE, related_name="tables")
    tp = models.PositiveSmallIntegerField()
    dp = models.PositiveSmallIntegerField()
    ep = models.PositiveSmallIntegerField()
    rank = models.PositiveSmallIntegerField()
    sequence_parallel = models.BooleanField()
    table_path = models.CharField(max_length=1024)
    table_sha256 = models.CharField(max_length=64)
    contract = models.JSONField()
    contract_id = models.CharField(max_length=64, blank=True)
    coverage = models.JSONField()
    components = models.JSONField()
    modes = models.JSONField()
    # What executed the expert region (registry.bundles.services.describe.table_identity): the
    # adapter, the kernel vLLM resolved, whether vLLM's own kernels ran, and vLLM's version.
    backend = models.CharField(max_length=128, blank=True, help_text="execution path (adapter)")
    kernel = models.CharField(max_length=128, blank=True, help_text="native kernel backend")
    native = models.BooleanField(default=False, help_text="vLLM's own kernels ran")
    vllm_version = models.CharField(max_length=64, blank=True)
    # When this table's points were measured (describe.table_measured_at): a bundle's tables
    # may be measured days apart, and a lookup by name ranks each table by its own time.
    measured_at = models.DateTimeField(null=True, blank=True)
    row_count = models.PositiveIntegerField()
    # Measured support: N over expert rows, A and M over positive-work expert rows, and the
    # local components' own row counts.
    tokens_min = models.IntegerField(null=True)
    tokens_max = models.IntegerField(null=True)
    activated_experts_min = models.IntegerField(null=True)
    activated_experts_max = models.IntegerField(null=True)
    local_assignments_min = models.IntegerField(null=True)
    local_assignments_max = models.IntegerField(null=True)
    local_tokens_min = models.IntegerField(null=True)
    local_tokens_max = models.IntegerField(null=True)

    class Meta:
        ordering = ("tp", "dp", "rank", "sequence_parallel")
        constraints = (
            models.UniqueConstraint(
                fields=["bundle", "tp", "dp", "rank", "sequence_parallel"],
                name="registry_one_table_per_deployment",
            ),
            models.CheckConstraint(
                condition=models.Q(measured_at__isnull=True)
                | models.Q(
                    measured_at__gte=MEASURED_AT_RANGE[0], measured_at__lt=MEASURED_AT_RANGE[1]
                ),
                name="registry_table_measured_at_in_range",
            ),
        )
        indexes = (
            models.Index(fields=["tp", "dp", "ep"]),
            models.Index(fields=["dp"]),
            models.Index(fields=["ep"]),
            models.Index(fields=["backend"]),
            models.Index(fields=["kernel"], name="registry_de_kernel_idx"),
            # The lookup's choice of a bundle for a target (registry.lookup.services).
            models.Index(
                fields=["tp", "dp", "rank", "sequence_parallel"], name="registry_de_target_idx"
            ),
        )

    def __str__(self) -> str:
        sp = int(self.sequence_parallel)
        return f"tp{self.tp} dp{self.dp}_ep{self.ep}_rank{self.rank}_sp{sp}"

    def brief(self) -> dict[str, Any]:
        """The table as a bundle list shows it."""
        return {
            "deployment": str(self),
            **self.target,
            "backend": self.backend,
            "kernel": self.kernel,
            "native": self.native,
            "vllm_version": self.vllm_version,
        }

    @property
    def target(self) -> dict[str, Any]:
        return {
            "tp": self.tp,
            "dp": self.dp,
            "ep": self.ep,
            "rank": self.rank,
            "sequence_parallel": self.sequence_parallel,
        }
