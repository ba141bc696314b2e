"""manage.py export_bundle ID_OR_SHA256 [-o PATH] [--folder]: the download, from a shell."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from registry.bundles.models import Bundle
from registry.bundles.services import export_bundle


class Command(BaseCommand):
    help = "Write a stored bundle as .tar.gz (the same bytes as its download) or as a folder."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("bundle", help="bundle id, or its sha256 (or a unique prefix)")
        parser.add_argument("-o", "--output", type=Path, help="file or folder to write")
        parser.add_argument("--folder", action="store_true", help="write a bundle folder")

    def handle(self, *args: Any, **options: Any) -> None:
        key: str = options["bundle"]
        if key.isdigit() and len(key) < 20:
            matches = list(Bundle.objects.filter(pk=int(key)))
        else:
            matches = list(Bundle.objects.filter(sha256__startswith=key.lower())[:2])
        if len(matches) != 1:
            raise CommandError(f"{key}: {'ambiguous' if matches else 'no such bundle'}")
        bundle = matches[0]
        suffix = "" if options["folder"] else ".tar.gz"
        dest = options["output"] or Path(bundle.archive_stem + suffix)
        try:
            written = export_bundle(bundle, dest, as_folder=options["folder"])
        except FileExistsError as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(f"{written} ({bundle.sha256})")
