"""Each table says when it was measured; a bundle's measured time counts its tables' times.

A bundle's tables need not share a day: ranks measured later are moved in beside an older DP1
table (`acquisition.transplant`), and the bundle's time was its root's (the first
publication), so a lookup by name ranked those newer ranks by the older day. The data step
fills the new column and the bundle's time again from the stored contracts and coverages, by
the same functions publication uses.
"""

from __future__ import annotations

import datetime
from typing import Any

from django.db import migrations, models


def fill_measured_at(apps: Any, schema_editor: Any) -> None:
    from registry.bundles.services.describe import measured_at_of_meta, table_measured_at

    Bundle = apps.get_model("registry", "Bundle")
    for bundle in Bundle.objects.all().iterator():
        tables = list(bundle.tables.all())
        for table in tables:
            table.measured_at = table_measured_at(table.contract, table.coverage)
            table.save(update_fields=["measured_at"])
        bundle.measured_at = measured_at_of_meta(
            bundle.meta, [t.coverage for t in tables], [t.contract for t in tables]
        )
        bundle.save(update_fields=["measured_at"])


class Migration(migrations.Migration):
    dependencies = [("registry", "0008_routing_profiles")]

    operations = [
        migrations.AddField(
            model_name="deploymenttable",
            name="measured_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddConstraint(
            model_name="deploymenttable",
            constraint=models.CheckConstraint(
                condition=models.Q(("measured_at__isnull", True))
                | models.Q(
                    ("measured_at__gte", datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)),
                    ("measured_at__lt", datetime.datetime(9000, 1, 1, tzinfo=datetime.UTC)),
                ),
                name="registry_table_measured_at_in_range",
            ),
        ),
        migrations.RunPython(fill_measured_at, migrations.RunPython.noop),
    ]
