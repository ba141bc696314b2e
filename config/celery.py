"""The Celery app. Tasks live in each app's ``tasks`` module and only enqueue model work.

The default broker is kombu's filesystem transport under ``var/celery`` so a single machine
needs no server; ``CELERY_BROKER_URL=redis://...`` selects Redis (docker-compose.yml does).
"""

from __future__ import annotations

import os
from typing import Any

from celery import Celery

from registry.jobs.broker import SWEEP_TASK
from registry.jobs.broker import ensure_broker_folders as _ensure_folders

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

app = Celery("moe_registry")
app.config_from_object("django.conf:settings", namespace="CELERY")
# Each app's ``tasks`` module, and the jobs' own (registry/jobs/tasks.py).
app.autodiscover_tasks()
app.autodiscover_tasks(["registry.jobs"])

__all__ = ["SWEEP_TASK", "app", "ensure_broker_folders"]


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
            float(every),
            sender.signature(SWEEP_TASK),
            name=SWEEP_TASK,
            queue="default",
            expires=float(every),
        )


def ensure_broker_folders() -> None:
    """The broker's folders for this app (see `registry.jobs.broker.ensure_broker_folders`)."""
    _ensure_folders(app)
