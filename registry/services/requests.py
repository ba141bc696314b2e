"""Requests for coverage gaps, and which worker queues are online.

A signed-in user asks for a missing cell of the coverage matrix. When a worker of the
hardware's queue has been seen recently the request becomes an acquisition job at once;
otherwise it stays open (listed on the coverage page) until a job of that hardware fills it.
A second ask for the same cell adds its user to the open request instead of a duplicate.
Publishing a table for the cell closes the request (`close_filled_requests`).
"""

from __future__ import annotations

import logging
import threading
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from django.db import IntegrityError, transaction
from django.utils import timezone

from acquisition.options import cell_problem
from registry.bundles.models import DeploymentTable
from registry.coverage_models import CoverageRequest, WorkerPresence

if TYPE_CHECKING:
    from registry.models import AcquisitionJob, Bundle

__all__ = [
    "PRESENCE_INTERVAL_S",
    "NotMeasurable",
    "close_filled_requests",
    "not_measurable",
    "open_request_index",
    "queue_online",
    "record_presence",
    "request_cell",
    "start_presence_heartbeat",
    "waiting_for_worker",
]

log = logging.getLogger(__name__)
PRESENCE_INTERVAL_S = 20.0
# Seen within three heartbeats: online.
_ONLINE_S = 3 * PRESENCE_INTERVAL_S


class NotMeasurable(ValueError):
    """The cell's backend cannot measure it (the message says why); no request is recorded."""


def record_presence(node: str, queues: list[str]) -> None:
    WorkerPresence.objects.update_or_create(
        node=node, defaults={"queues": sorted(queues), "last_seen": timezone.now()}
    )


def start_presence_heartbeat(node: str, queues: list[str]) -> threading.Thread:
    """Stamp this worker every PRESENCE_INTERVAL_S seconds while its process lives."""
    stop = threading.Event()

    def beat() -> None:
        from django.db import close_old_connections

        while not stop.is_set():
            try:
                record_presence(node, queues)
            except Exception:  # the database may come back; the next beat tries again
                log.exception("worker presence not recorded")
            finally:
                close_old_connections()
            stop.wait(PRESENCE_INTERVAL_S)

    thread = threading.Thread(target=beat, name="worker-presence", daemon=True)
    thread.start()
    return thread


def queue_online(queue: str) -> bool:
    since = timezone.now() - timedelta(seconds=_ONLINE_S)
    return any(
        queue in (p.queues or []) for p in WorkerPresence.objects.filter(last_seen__gte=since)
    )


def waiting_for_worker(job: AcquisitionJob) -> str | None:
    """For a queued job: a sentence when no worker of its queue is online, else None."""
    if job.state != "queued":
        return None
    seen = [p for p in WorkerPresence.objects.all() if job.queue in (p.queues or [])]
    if not seen:
        return f"no worker of queue {job.queue} has been seen; the job waits until one starts"
    latest = max(p.last_seen for p in seen)
    if latest < timezone.now() - timedelta(seconds=_ONLINE_S):
        return (
            f"no worker of queue {job.queue} is online (last seen "
            f"{latest:%Y-%m-%d %H:%M} UTC); the job waits until one starts"
        )
    return None


def not_measurable(backend: str, model: str, d: tuple[int, int, int, int, bool]) -> str | None:
    """For a gap: "not measurable by <backend>: <reason>", or None when a job can fill it.

    The acquisition's own declared rules decide (``acquisition.options.cell_problem``, the
    same the adapters' admission applies), so a gap no job of that backend could fill (the
    live path beyond TP1/DP1/EP1, R25) is never offered as a request.
    """
    tp, dp, _ep, rank, sp = d
    problem = cell_problem(backend, model, tp=tp, dp=dp, rank=rank, sequence_parallel=sp)
    return None if problem is None else f"not measurable by {backend}: {problem}"


def _variant_dtype(variant: str) -> str:
    return {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}.get(variant, "auto")


def _job_parameters(cell: dict[str, Any]) -> dict[str, Any]:
    params: dict[str, Any] = {
        "model": cell["model"],
        "hardware": cell["hardware"],
        "tp": [cell["tp"]],
        "dp": [cell["dp"]],
        "dtype": _variant_dtype(cell["variant"]),
        # A measurable cell's backend is always one the acquisition runs (not_measurable).
        "backend": cell["backend"],
    }
    return params


def request_cell(user: Any, cell: dict[str, Any]) -> tuple[CoverageRequest, bool]:
    """Record (or join) the request for ``cell``; queue a job when its queue is online.

    Returns the request and whether this call created it (False: joined an open one).

    ``cell`` has hardware, model, variant, backend, tp, dp, rank, sequence_parallel. Raises
    ValueError for a cell that already has a table, NotMeasurable (a ValueError) for one its
    backend cannot measure (the matrix shows no Request button there), NotAllowed for a user who may not queue
    jobs (registry.permissions.can_queue_job), and the job service's errors when the
    acquisition would refuse the parameters.
    """
    from registry.jobs.parameters import queue_for, validate_parameters
    from registry.jobs.services import queue_job
    from registry.permissions import NotAllowed, can_queue_job

    # A request may become a job at once: the same rule as queueing one.
    if not can_queue_job(user):
        raise NotAllowed("sign in (or use an API token) to request coverage")

    keys = ("hardware", "model", "variant", "backend", "tp", "dp", "rank", "sequence_parallel")
    cell = {k: cell[k] for k in keys}
    cell["ep"] = cell["tp"] * cell["dp"]
    filled = DeploymentTable.objects.filter(
        bundle__hardware=cell["hardware"],
        bundle__model=cell["model"],
        bundle__variant=cell["variant"],
        backend=cell["backend"],
        tp=cell["tp"],
        dp=cell["dp"],
        rank=cell["rank"],
        sequence_parallel=cell["sequence_parallel"],
    ).exists()
    if filled:
        raise ValueError("this cell already has a published table")
    deployment = (cell["tp"], cell["dp"], cell["ep"], cell["rank"], cell["sequence_parallel"])
    problem = not_measurable(cell["backend"], cell["model"], deployment)
    if problem is not None:
        raise NotMeasurable(problem)
    params = _job_parameters(cell)
    clean = validate_parameters(params)
    with transaction.atomic():
        existing = (
            CoverageRequest.objects.select_for_update()
            .exclude(state=CoverageRequest.State.CLOSED)
            .filter(**{k: cell[k] for k in keys})
            .first()
        )
        if existing is not None:
            existing.requesters.add(user)
            return existing, False
        created = True
        try:
            with transaction.atomic():
                request = CoverageRequest.objects.create(**cell, requested_by=user)
        except IntegrityError:  # someone asked at the same moment: join theirs
            created = False
            request = CoverageRequest.objects.exclude(state="closed").get(
                **{k: cell[k] for k in keys}
            )
        request.requesters.add(user)
    if request.state == CoverageRequest.State.OPEN and queue_online(queue_for(clean)):
        job = queue_job(user, params)
        CoverageRequest.objects.filter(pk=request.pk, state="open").update(
            state=CoverageRequest.State.QUEUED, job=job
        )
        request.refresh_from_db()
    return request, created


def close_filled_requests(bundle: Bundle, job: AcquisitionJob | None = None) -> int:
    """Close every open or queued request that ``bundle``'s tables fill."""
    closed = 0
    now = timezone.now()
    for table in bundle.tables.all():
        closed += (
            CoverageRequest.objects.exclude(state="closed")
            .filter(
                hardware=bundle.hardware,
                model=bundle.model,
                variant=bundle.variant,
                backend=table.backend,
                tp=table.tp,
                dp=table.dp,
                rank=table.rank,
                sequence_parallel=table.sequence_parallel,
            )
            .update(state="closed", closed_at=now, **({"job": job} if job is not None else {}))
        )
    return closed


def open_request_index() -> dict[tuple[Any, ...], dict[str, Any]]:
    """Open and queued requests by cell key, as the coverage matrix shows them."""
    found: dict[tuple[Any, ...], dict[str, Any]] = {}
    requests = CoverageRequest.objects.exclude(state="closed").select_related("requested_by")
    for r in requests.prefetch_related("requesters"):
        found[r.cell] = {
            "id": r.pk,
            "state": r.state,
            "job": r.job_id,
            "requested_at": r.created_at,
            "requested_by": r.requested_by.get_username() if r.requested_by else None,
            "requesters": len(r.requesters.all()),
        }
    return found
