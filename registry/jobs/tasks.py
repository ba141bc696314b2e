"""Celery tasks of the jobs. Each is one call into the runner or the sweep.

Job messages carry only the job id; the job row is the state (see registry.jobs.runner). The
tasks are sent by name (`registry.jobs.broker.RUN_TASK`, beat's `SWEEP_TASK`): nothing imports
this module but the worker (config/celery.py discovers it).
"""

from __future__ import annotations

import logging
import socket
from typing import Any

from celery import Task, shared_task
from celery.signals import worker_ready

from registry.jobs.broker import RUN_TASK, SWEEP_TASK
from registry.jobs.runner import run_job
from registry.jobs.sweep import recover_jobs
from registry.jobs.sweep import sweep_orphaned_jobs as sweep

__all__ = ["run_acquisition_job", "sweep_orphaned_jobs"]

log = logging.getLogger(__name__)


@shared_task(
    bind=True,
    name=RUN_TASK,
    acks_late=True,
    # A worker killed mid-job leaves the message unacknowledged: it is delivered again.
    reject_on_worker_lost=True,
    ignore_result=True,
)
def run_acquisition_job(self: Task[Any, Any], job_id: int) -> str:
    return run_job(job_id, worker=self.request.hostname or socket.gethostname())


@shared_task(
    name=SWEEP_TASK,
    # Sent by beat every JOB_SWEEP_S (config/celery.py); a lost run is simply the next one.
    acks_late=False,
    ignore_result=True,
)
def sweep_orphaned_jobs() -> list[str]:
    """Re-send, fail or cancel the jobs no worker will finish (registry.jobs.sweep)."""
    return [str(released) for released in sweep()]


@worker_ready.connect
def announce_worker(sender: Any = None, **_: Any) -> None:
    """Stamp this node and its queues while it runs: a coverage request queues a job only
    when a worker of its hardware's queue is online, and a queued job says when none is."""
    from registry.services.requests import start_presence_heartbeat

    try:
        queues = sorted(sender.app.amqp.queues.consume_from)
        start_presence_heartbeat(sender.hostname, queues)
    except Exception:  # a worker with no database yet still starts
        log.exception("announcing the worker failed")


@worker_ready.connect
def recover_orphaned_jobs(sender: Any = None, **_: Any) -> None:
    """On start, release the jobs that a dead worker of these queues left running.

    The periodic sweep would find them too, after JOB_STALE_S; a restarted node need not wait.
    """
    try:
        queues = list(sender.app.amqp.queues.consume_from)
        recovered = recover_jobs(sender.hostname, queues)
    except Exception:  # a worker with no database yet still starts
        log.exception("recovering orphaned jobs failed")
        return
    if recovered:
        log.warning("re-sent orphaned jobs %s", recovered)
