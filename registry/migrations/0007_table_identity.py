"""Tables say what executed them: adapter, kernel, native or not, vLLM version (issue 13).

Before, ``backend`` held whichever name the contract gave first (an adapter for current
bundles, a kernel for historical ones) and current-layout bundles had no vLLM version. The
data step fills the new columns, ``backend``, the bundle's vLLM version, measured time and
table briefs again from the stored contracts and metadata, by the same functions that
publication uses.
"""

from __future__ import annotations

from typing import Any

from django.db import migrations, models


def fill_identity(apps: Any, schema_editor: Any) -> None:
    from registry.bundles.services.describe import (
        measured_at_of_meta,
        table_identity,
        vllm_version_of_meta,
    )

    Bundle = apps.get_model("registry", "Bundle")
    for bundle in Bundle.objects.all().iterator():
        tables = list(bundle.tables.all().order_by("tp", "dp", "rank", "sequence_parallel"))
        for table in tables:
            for key, value in table_identity(table.contract).items():
                setattr(table, key, value)
            table.save(update_fields=["backend", "kernel", "native", "vllm_version"])
        bundle.vllm_version = vllm_version_of_meta(bundle.meta, [t.contract for t in tables])
        if bundle.measured_at is None:
            bundle.measured_at = measured_at_of_meta(bundle.meta, [t.coverage for t in tables])
        bundle.targets = [
            {
                "deployment": f"tp{t.tp} dp{t.dp}_ep{t.ep}_rank{t.rank}_sp{int(t.sequence_parallel)}",
                "tp": t.tp,
                "dp": t.dp,
                "ep": t.ep,
                "rank": t.rank,
                "sequence_parallel": t.sequence_parallel,
                "backend": t.backend,
                "kernel": t.kernel,
                "native": t.native,
                "vllm_version": t.vllm_version,
            }
            for t in tables
        ]
        bundle.save(update_fields=["vllm_version", "measured_at", "targets"])


class Migration(migrations.Migration):
    dependencies = [("registry", "0006_merge_0004_coverage_requests_0005_hash_api_tokens")]

    operations = [
        migrations.AddField(
            model_name="deploymenttable",
            name="kernel",
            field=models.CharField(blank=True, help_text="native kernel backend", max_length=128),
        ),
        migrations.AddField(
            model_name="deploymenttable",
            name="native",
            field=models.BooleanField(default=False, help_text="vLLM's own kernels ran"),
        ),
        migrations.AddField(
            model_name="deploymenttable",
            name="vllm_version",
            field=models.CharField(blank=True, max_length=64),
        ),
        migrations.AlterField(
            model_name="deploymenttable",
            name="backend",
            field=models.CharField(
                blank=True, help_text="execution path (adapter)", max_length=128
            ),
        ),
        migrations.AddIndex(
            model_name="deploymenttable",
            index=models.Index(fields=["kernel"], name="registry_de_kernel_idx"),
        ),
        migrations.AddIndex(
            model_name="deploymenttable",
            index=models.Index(
                fields=["tp", "dp", "rank", "sequence_parallel"], name="registry_de_target_idx"
            ),
        ),
        migrations.RunPython(fill_identity, migrations.RunPython.noop),
    ]
