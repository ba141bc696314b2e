"""manage.py sweep_jobs: release orphaned acquisition jobs now (what Celery beat runs)."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from registry.jobs.sweep import sweep_orphaned_jobs


class Command(BaseCommand):
    help = (
        "Re-send, fail or cancel the acquisition jobs that no worker will finish: running jobs "
        "silent for REGISTRY_JOB_STALE_S seconds, queued jobs whose message was lost. Safe to "
        "run at any time, beside the scheduled sweep."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--queue", action="append", help="only jobs of this queue (repeat)")
        parser.add_argument(
            "--dry-run", action="store_true", help="say what would be done, change nothing"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        dry_run = options["dry_run"]
        released = sweep_orphaned_jobs(options["queue"], dry_run=dry_run)
        for item in released:
            done = f"would be {item.action}" if dry_run else str(item.action)
            self.stdout.write(f"job {item.job_id}: {done} ({item.reason})")
        verb = "would release" if dry_run else "released"
        self.stdout.write(f"{verb} {len(released)} orphaned jobs")
