"""manage.py verify_bundles: re-hash every stored file (bundles' and routing profiles'); exit 1 on
any drift."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from registry.bundles.models import Bundle
from registry.bundles.services import verify_bundles
from registry.services.profiles import verify_profile_files


class Command(BaseCommand):
    help = (
        "Re-hash every stored bundle file and routing profile and report drift from what was "
        "published."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--bundle", type=int, action="append", help="only these bundle ids")
        parser.add_argument(
            "--profile", type=int, action="append", help="only these routing profile ids"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        only_some = bool(options["bundle"] or options["profile"])
        bundles = list(
            Bundle.objects.filter(pk__in=options["bundle"] or []).order_by("id")
            if only_some
            else Bundle.objects.order_by("id")
        )
        report = verify_bundles(bundles)
        profiles, profile_drifts = verify_profile_files(
            (options["profile"] or []) if only_some else None
        )
        for drift in report.drifts:
            self.stderr.write(f"DRIFT {drift}")
        for line in profile_drifts:
            self.stderr.write(f"DRIFT {line}")
        drifted = len(report.drifts) + len(profile_drifts)
        summary = (
            f"checked {report.bundles} bundles, {report.files} files, {profiles} routing "
            f"profiles: {drifted} drifted"
        )
        if drifted:
            raise CommandError(summary)
        self.stdout.write(summary)
