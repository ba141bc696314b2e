"""The Celery app. Tasks live in each app's ``tasks`` module and only enqueue model work.

The default broker is kombu's filesystem transport under ``var/celery`` so a single machine
needs no server; ``CELERY_BROKER_URL=redis://...`` selects Redis (docker-compose.yml does).
"""

from __future__ import annotations

import os
from pathlib import Path

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

app = Celery("moe_registry")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


def ensure_broker_folders() -> None:
    """The filesystem transport needs its folders to exist before a worker or sender starts."""
    options = app.conf.broker_transport_options or {}
    for key in ("data_folder_in", "data_folder_out", "processed_folder", "control_folder"):
        if options.get(key):
            Path(options[key]).mkdir(parents=True, exist_ok=True)
    backend = str(app.conf.result_backend or "")
    if backend.startswith("file://"):
        Path(backend.removeprefix("file://")).mkdir(parents=True, exist_ok=True)
