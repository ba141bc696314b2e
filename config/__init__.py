"""The Django project: env-driven settings, URL map and the Celery app."""

from __future__ import annotations

# Loading the Celery app with Django makes @shared_task bind to it in every process.
from config.celery import app as celery_app

__all__ = ["celery_app"]
