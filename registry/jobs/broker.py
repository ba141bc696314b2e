"""The jobs' side of the Celery broker: is it there, send a job's message, count a queue.

Tasks are sent by name (`RUN_TASK`), so nothing here imports the task module or the project's
Celery app: ``celery.current_app`` is the app `config.celery` made current at start-up.
Warehouse's rule holds for every sender: a job's message leaves only after the row it names
is committed (the callers send from ``transaction.on_commit``).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any
from uuid import uuid4

from celery import current_app

if TYPE_CHECKING:
    from celery import Celery

    from registry.jobs.models import AcquisitionJob

__all__ = [
    "RUN_TASK",
    "SWEEP_TASK",
    "BrokerUnavailable",
    "broker_errors",
    "check_broker",
    "ensure_broker_folders",
    "new_task_id",
    "ready_messages",
    "send_job",
]

RUN_TASK = "registry.run_acquisition_job"
SWEEP_TASK = "registry.sweep_orphaned_jobs"


class BrokerUnavailable(RuntimeError):
    """The Celery broker does not answer; nothing was queued."""


def broker_errors() -> tuple[type[BaseException], ...]:
    """What a broker that does not answer raises (kombu's own and the socket's)."""
    from kombu.exceptions import OperationalError

    return (OperationalError, OSError, ConnectionError, TimeoutError)


def ensure_broker_folders(app: Celery | None = None) -> None:
    """The filesystem transport needs its folders to exist before a worker or sender starts,
    and beat the folder of its schedule file before it opens it."""
    app = app or current_app
    options = app.conf.broker_transport_options or {}
    for key in ("data_folder_in", "data_folder_out", "processed_folder", "control_folder"):
        if options.get(key):
            Path(options[key]).mkdir(parents=True, exist_ok=True)
    backend = str(app.conf.result_backend or "")
    if backend.startswith("file://"):
        Path(backend.removeprefix("file://")).mkdir(parents=True, exist_ok=True)
    if app.conf.beat_schedule_filename:
        Path(app.conf.beat_schedule_filename).parent.mkdir(parents=True, exist_ok=True)


def check_broker() -> None:
    """Raise `BrokerUnavailable` unless the broker accepts a connection now (no retries)."""
    try:
        ensure_broker_folders()
        with current_app.connection_for_write() as connection:
            connection.ensure_connection(max_retries=1, interval_start=0, timeout=3)
    except broker_errors() as exc:
        raise BrokerUnavailable(f"the job queue (Celery broker) does not answer: {exc}") from exc


def new_task_id() -> str:
    """The id of the next message for a job, stored in the row before the message is sent."""
    return str(uuid4())


def send_job(job: AcquisitionJob) -> str:
    """Send the job's message to its queue under ``job.celery_task_id``; returns that id.

    The id is written with the state change that the message stands for (queue, retry,
    requeue), so nothing writes the row after the message leaves: a worker may claim the job
    the moment it is sent, and a write here would race with (on SQLite: wait behind) its claim.
    """
    task_id = job.celery_task_id or new_task_id()
    try:
        ensure_broker_folders()
        with current_app.connection_for_write() as connection:
            connection.ensure_connection(max_retries=1, interval_start=0, timeout=3)
            current_app.send_task(
                RUN_TASK,
                args=(job.pk,),
                queue=job.queue,
                connection=connection,
                retry=False,
                task_id=task_id,
                ignore_result=True,
            )
    except broker_errors() as exc:
        raise BrokerUnavailable(f"the job queue (Celery broker) does not answer: {exc}") from exc
    job.celery_task_id = task_id
    return task_id


def ready_messages(queue: str) -> int:
    """Messages waiting in ``queue`` on the broker (not those a worker has taken)."""
    ensure_broker_folders()
    with current_app.connection_for_read() as connection:
        connection.ensure_connection(max_retries=1, interval_start=0, timeout=3)
        try:
            channel: Any = connection.default_channel  # kombu's virtual channel
            declared = channel.queue_declare(queue=queue, passive=True)
        except connection.channel_errors:
            return 0  # Redis keeps no key for an empty queue: passive declare says not found
        return int(declared.message_count)
