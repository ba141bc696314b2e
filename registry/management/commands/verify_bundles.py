"""manage.py verify_bundles: re-hash every stored file; exit 1 on any drift."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from registry.bundles.models import Bundle
from registry.bundles.services import verify_bundles


class Command(BaseCommand):
    help = "Re-hash every stored bundle file and report drift from the published manifests."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--bundle", type=int, action="append", help="only these bundle ids")

    def handle(self, *args: Any, **options: Any) -> None:
        bundles = None
        if options["bundle"]:
            bundles = list(Bundle.objects.filter(pk__in=options["bundle"]).order_by("id"))
        report = verify_bundles(bundles)
        for drift in report.drifts:
            self.stderr.write(f"DRIFT {drift}")
        drifted = len(report.drifts)
        summary = f"checked {report.bundles} bundles, {report.files} files: {drifted} drifted"
        if not report.ok:
            raise CommandError(summary)
        self.stdout.write(summary)
