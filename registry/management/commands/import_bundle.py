"""manage.py import_bundle PATH...: publish bundle folders and archives from disk.

A PATH is a bundle folder (it holds meta.yaml), an archive (.tar.gz, .zip), or a folder of
bundles: every folder below it holding a meta.yaml is one bundle. Importing the same content
again is a no-op, so the run command can import the shipped bundles on every start.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from registry.bundles.services import PublishResult, publish_bundle
from registry.choices import BundleSource
from registry.management.publishing import publish_each


def bundle_sources(path: Path) -> list[Path]:
    if path.is_file() or (path / "meta.yaml").is_file():
        return [path]
    if not path.is_dir():
        raise CommandError(f"{path}: no such file or folder")
    found: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(path):
        if "meta.yaml" in filenames:
            found.append(Path(dirpath))
            dirnames.clear()  # a bundle's own folders are not bundles
        else:
            dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
    return sorted(found)


class Command(BaseCommand):
    help = "Validate and publish bundle folders or archives (idempotent)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("paths", nargs="+", type=Path)
        parser.add_argument(
            "--source",
            choices=[BundleSource.IMPORT, BundleSource.ACQUISITION],
            default=BundleSource.IMPORT,
            help="how the bundle reached the registry",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        sources = [s for path in options["paths"] for s in bundle_sources(path)]
        if not sources:
            raise CommandError("no bundles found (no meta.yaml below the given paths)")

        def publish(source: Path) -> PublishResult:
            return publish_bundle(source, source_kind=options["source"], source_detail=str(source))

        publish_each(self, sources, publish, self._report, what="bundles")

    def _report(self, source: Path, result: PublishResult) -> None:
        bundle = result.bundle
        state = "imported" if result.created else "already present"
        self.stdout.write(
            f"{state}: bundle {bundle.pk} {bundle.sha256} "
            f"{bundle.hardware} {bundle.model} {bundle.variant} ({source})"
        )
        for rel in result.left_out:
            self.stdout.write(f"  left out (not part of a published bundle): {rel}")
        if result.missing_files:
            # One line: these are other profile categories' files, not a fault of the MoE
            # tables (docs/bundle-format.md, "Files the metadata names but the bundle lacks").
            names = ", ".join(result.missing_files)
            self.stdout.write(
                f"  note: meta.yaml also names {len(result.missing_files)} files of other "
                f"profile categories that are not part of its MoE tables (kept as given, "
                f"reported as missing): {names}"
            )
