"""The Celery app. Tasks live in each app's ``tasks`` module and only enqueue model work.

The default broker is kombu's filesystem transport under ``var/celery`` so a single machine
needs no server; ``CELERY_BROKER_URL=redis://...`` selects Redis (docker-compose.yml does).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

app = Celery("moe_registry")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()

SWEEP_TASK = "registry.sweep_orphaned_jobs"


@app.on_after_configure.connect
def schedule_housekeeping(sender: Celery, **_: Any) -> None:
    """Celery beat's schedule: the orphan sweep every REGISTRY_JOB_SWEEP_S seconds.

    Beat runs once per deployment: embedded in the housekeeping worker (``-B``) by
    ``scripts/run.sh``, its own ``beat`` service in docker-compose.yml. The sweep goes to the
    ``default`` queue, which a worker that never runs acquisitions consumes, so a long job
    cannot hold it up; a message not taken within one period expires (the next one follows).
    """
    from django.conf import settings

    every = settings.REGISTRY["JOB_SWEEP_S"]
    if every > 0:
        sender.add_periodic_task(
            float(every), sender.signature(SWEEP_TASK), name=SWEEP_TASK,
            queue="default", expires=float(every),
        )


def ensure_broker_folders() -> None:
    """The filesystem transport needs its folders to exist before a worker or sender starts,
    and beat the folder of its schedule file before it opens it."""
    options = app.conf.broker_transport_options or {}
    for key in ("data_folder_in", "data_folder_out", "processed_folder", "control_folder"):
        if options.get(key):
            Path(options[key]).mkdir(parents=True, exist_ok=True)
    backend = str(app.conf.result_backend or "")
    if backend.startswith("file://"):
        Path(backend.removeprefix("file://")).mkdir(parents=True, exist_ok=True)
    if app.conf.beat_schedule_filename:
        Path(app.conf.beat_schedule_filename).parent.mkdir(parents=True, exist_ok=True)
