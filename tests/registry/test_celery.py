"""The Celery app: configured from Django settings, embedded filesystem broker by default."""

from __future__ import annotations

from typing import TYPE_CHECKING

from django.conf import settings

from config.celery import app, ensure_broker_folders

if TYPE_CHECKING:
    from pathlib import Path


def test_it_reads_its_configuration_from_django_settings() -> None:
    assert app.main == "moe_registry"
    assert app.conf.task_acks_late is True
    assert app.conf.broker_url == settings.CELERY_BROKER_URL
    assert settings.CELERY_BROKER_URL.startswith(("filesystem://", "redis://"))


def test_it_queues_a_message_on_the_embedded_broker(tmp_path: Path) -> None:
    queue = tmp_path / "queue"
    saved = (app.conf.broker_url, app.conf.broker_transport_options, app.conf.result_backend)
    app.conf.broker_url = "filesystem://"
    app.conf.broker_transport_options = {
        "data_folder_in": str(queue),
        "data_folder_out": str(queue),
        "processed_folder": str(tmp_path / "processed"),
        "control_folder": str(tmp_path / "control"),  # kombu's default is ./control
    }
    app.conf.result_backend = f"file://{tmp_path / 'results'}"
    try:
        ensure_broker_folders()
        with app.connection_for_write() as connection:
            app.send_task("registry.ping", args=[1], connection=connection, queue="default")
    finally:
        app.conf.broker_url, app.conf.broker_transport_options, app.conf.result_backend = saved
    assert (tmp_path / "results").is_dir()
    messages = list(queue.iterdir())
    assert len(messages) == 1
    assert b"registry.ping" in messages[0].read_bytes()
