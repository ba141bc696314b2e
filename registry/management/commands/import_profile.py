"""manage.py import_profile PATH...: publish routing profiles (``*.routing.npz``) from disk.

A PATH is a profile file or a folder: every ``*.routing.npz`` below it is one profile. Importing
the same bytes again is a no-op, so the run command imports the shipped profiles on every start
(as `import_bundle` does for the shipped bundles). Each file is validated by
`moetables.profiles.read_profile`; a refused one is named with every problem and the command
exits non-zero after trying the rest.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from registry.management.publishing import publish_each
from registry.services.profiles import ProfileUploadResult, import_profile_file

SUFFIX = ".routing.npz"


def profile_sources(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    if not path.is_dir():
        raise CommandError(f"{path}: no such file or folder")
    return sorted(
        p
        for p in path.rglob(f"*{SUFFIX}")
        if p.is_file() and not any(part.startswith(".") for part in p.relative_to(path).parts)
    )


class Command(BaseCommand):
    help = "Validate and publish routing profile files (idempotent)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("paths", nargs="+", type=Path)

    def handle(self, *args: Any, **options: Any) -> None:
        sources = [s for path in options["paths"] for s in profile_sources(path)]
        if not sources:
            raise CommandError(f"no routing profiles found (no *{SUFFIX} below the given paths)")
        publish_each(self, sources, import_profile_file, self._report, what="routing profiles")

    def _report(self, source: Path, result: ProfileUploadResult) -> None:
        record = result.record
        state = "imported" if result.created else "already present"
        self.stdout.write(
            f"{state}: routing profile {record.pk} {record.sha256} {record.model} "
            f"({record.router}; {record.layers} layers, {record.steps} steps) ({source})"
        )
