"""The loop the import commands share: publish each source, name every refusal, fail at the end.

A refused source does not stop the others; the command exits non-zero after trying them all,
so one bad file among the shipped ones is reported with every problem and the rest still land.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

from django.core.management.base import BaseCommand, CommandError

from registry.bundles.services import PublishError

Result = TypeVar("Result")


def publish_each(
    command: BaseCommand,
    sources: Sequence[Path],
    publish: Callable[[Path], Result],
    report: Callable[[Path, Result], None],
    *,
    what: str,
) -> None:
    """``publish`` every source and ``report`` what it published; ``what`` names them (plural)."""
    failed = 0
    for source in sources:
        try:
            result = publish(source)
        except PublishError as exc:
            failed += 1
            command.stderr.write(f"refused {source}:")
            for problem in exc.problems:
                command.stderr.write(f"  - {problem}")
            continue
        report(source, result)
    if failed:
        raise CommandError(f"{failed} of {len(sources)} {what} refused")
