"""Acquiring one target: build, condition, measure every planned point, publish when complete.

The loop owns checkpointing: each context's forwards, each control and each point's verdict go
to samples.jsonl as they are known, so a rerun of the same command resumes where a kill left
it (R9). A point whose B/2B control fails is measured again in a new attempt, up to
``settings.attempts`` times per run; the new attempt goes to the end of the target's queue, so
it runs at another moment of the run than the failed one. A point still failing keeps its
evidence and blocks publication of the target (a rerun tries it again). Attribution failures and reference
mismatches stop the target and leave failures.jsonl (and a Chrome trace) beside the samples.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import sys
import time
from collections import deque
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, NoReturn

import acquisition
from acquisition.adapters.base import AdapterRefusal
from acquisition.adapters.vllm_fp8 import oracle_environment
from acquisition.deferred_stop import stop_deferred
from acquisition.evidence import conservation_evidence, stability_rows
from acquisition.phases import PhaseClock
from acquisition.protocol.attribution import AttributionError
from acquisition.protocol.banks import physical_banks
from acquisition.protocol.measure import (
    ContextResult,
    PointError,
    PointMeter,
    PointRequest,
    context_order,
)
from acquisition.protocol.samples import PointState, SampleLog, append_failure, writer_lock
from acquisition.protocol.statistics import median_of_context_medians, stability_control
from acquisition.publish import build_contract, build_coverage, publish_target

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from pathlib import Path

    from acquisition.adapters import AdmissionReport, ComponentBackend
    from acquisition.adapters.base import ComponentSession, RuntimeInfo
    from acquisition.plan import PlanPoint, PointPlan
    from acquisition.progress import ProgressReporter
    from acquisition.request import AcquisitionRequest
    from moetables.bundle import Row

__all__ = [
    "AcquisitionFailure",
    "HeapStats",
    "TargetOutcome",
    "acquire_target",
    "frozen_heap",
    "release_target_memory",
]

# Free device memory kept back beyond the banks, for activations and the allocator.
_RESERVED_BYTES = 1 << 30


class AcquisitionFailure(RuntimeError):
    """The target cannot be completed; ``failures`` and ``trace`` name kept evidence."""

    def __init__(self, message: str, failures: Path | None = None, trace: Path | None = None):
        super().__init__(message)
        self.failures = failures
        self.trace = trace


@dataclass(slots=True)
class TargetOutcome:
    published: bool
    bundle: Path | None
    work_dir: Path
    measured_now: int = 0
    failed_points: list[str] = field(default_factory=list)


@dataclass(slots=True)
class _Pending:
    """A point still to decide in this run: attempts used, reference checked, seconds spent."""

    point: PlanPoint
    tries: int = 0
    verified: bool = False
    seconds: float = 0.0
    warm_up: bool = False  # measured in the target's first batch (its start in its seconds)


def _queue_order(log: SampleLog, points: list[PlanPoint]) -> list[PlanPoint]:
    """The unfinished points in the order the queue measures them, on resume as in one run.

    Points without a failed control first, in plan order; then the points whose latest
    recorded attempt failed its control (a retry a kill interrupted, or a point an earlier
    run recorded failed), in the order those controls were written: what the killed run's
    queue held, since a failed control sends its point to the end (``_measure_queue``).
    """

    def failed_at(point: PlanPoint) -> int | None:
        failed = [
            a.sequence
            for a in log.state(point.key).attempts.values()
            if a.control is not None and not a.control["passed"]
        ]
        return max(failed) if failed else None

    retries: list[tuple[int, int, PlanPoint]] = []
    fresh: list[PlanPoint] = []
    for index, point in enumerate(points):
        sequence = failed_at(point)
        if sequence is None:
            fresh.append(point)
        else:
            retries.append((sequence, index, point))
    return fresh + [point for _, _, point in sorted(retries)]


def _safe(key: str) -> str:
    return key.replace(":", "_")


def _identity(
    request: AcquisitionRequest,
    plan: PointPlan,
    backend: ComponentBackend,
    banks: int | None,
    runtime: RuntimeInfo,
) -> dict[str, Any]:
    """The immutable semantic conditions of a target's acquisition (resume identity);
    ``banks=None`` (before the build, which sizes the banks) leaves the bank count out."""
    identity = {
        "schema": "moe-acquisition-identity-v1",
        "model": request.model.name,
        "model_config_sha256": request.model.config_sha256,
        "hardware": request.hardware,
        "dtype": request.dtype,
        "target": plan.target.as_dict(),
        "backend": backend.name,
        "device": request.device,
        "point_plan_sha256": plan.sha256,
        "protocol": request.settings.identity(),
        "banks": banks,
        "cache_bytes": runtime.cache_bytes,
    }
    if banks is None:
        del identity["banks"]
    if request.model.block_fp8:
        # vLLM's FP8 kernels depend on these switches (2026-12-01 H200 run: DP1's samples came
        # from a process with DeepGEMM usable, E8M0 scales and unfused quantization, and were
        # re-published by one with VLLM_USE_DEEP_GEMM=0, whose session wrote the contract).
        # Samples and contract must come from one setting, so a changed one needs a new root.
        # Only block-FP8 targets carry it: bf16 checkpoints keep their identity and resume.
        identity["vllm_fp8_environment"] = oracle_environment(os.environ)
    return identity


def _check_memory(session: ComponentSession, runtime: RuntimeInfo, banks: int) -> None:
    """The bank allocation guard: 2B clones plus reserved memory must fit (R33)."""
    if runtime.device != "cuda":
        return
    import torch

    free, _ = torch.cuda.mem_get_info()
    need = banks * session.expert_bank_bytes() + _RESERVED_BYTES
    if need > free:
        raise AcquisitionFailure(
            f"{banks} weight banks of {session.expert_bank_bytes()} bytes plus "
            f"{_RESERVED_BYTES} reserved bytes need {need} bytes; {free} are free"
        )


def _context_lists(state: PointState, attempt: int, arm: str, rounds: int) -> list[list[float]]:
    contexts = state.attempts[attempt].contexts
    return [contexts[(arm, r)] for r in range(rounds)]


def _records(point: PlanPoint, attempt: int, results: list[ContextResult]) -> list[dict[str, Any]]:
    records: list[dict[str, Any]] = []
    for result in results:
        for index, time_us in enumerate(result.forwards_us):
            records.append(
                {
                    "type": "forward",
                    "point": point.key,
                    "attempt": attempt,
                    "arm": result.arm,
                    "round": result.round,
                    "index": index,
                    "time_us": time_us,
                }
            )
        records.append(
            {
                "type": "context",
                "point": point.key,
                "attempt": attempt,
                "arm": result.arm,
                "round": result.round,
                "forwards": len(result.forwards_us),
                "sets": result.sets,
            }
        )
    return records


class _TargetRun:
    def __init__(
        self,
        request: AcquisitionRequest,
        plan: PointPlan,
        backend: ComponentBackend,
        runtime: RuntimeInfo,
        report: AdmissionReport,
        progress: ProgressReporter,
        clock: PhaseClock,
    ) -> None:
        self.clock = clock
        self.request = request
        self.plan = plan
        self.backend = backend
        self.runtime = runtime
        self.report = report
        self.progress = progress
        self.work_dir = request.work_dir(plan.target)
        self.rounds = request.settings.rounds

    def fail(self, point: PlanPoint, attempt: int, reason: str, trace: Path | None) -> NoReturn:
        record = {
            "time": datetime.now(UTC).isoformat(),
            "point": point.key,
            "attempt": attempt,
            "reason": reason,
            "trace": trace.name if trace else None,
        }
        append_failure(self.work_dir, record)
        raise AcquisitionFailure(
            f"{self.plan.target.deployment} {point.key}: {reason}",
            failures=self.work_dir / "failures.jsonl",
            trace=trace,
        )

    def decide(self, log: SampleLog, point: PlanPoint, attempt: int) -> bool | None:
        """Write the verdict of a complete attempt: True measured, False control failed."""
        state = log.state(point.key)
        contexts = state.attempts[attempt].contexts
        if any(c not in contexts for c in context_order(point, self.rounds)):
            return None
        if not point.is_expert:
            time_us = median_of_context_medians(
                _context_lists(state, attempt, "local", self.rounds)
            )
            log.append(
                {
                    "type": "point",
                    "point": point.key,
                    "attempt": attempt,
                    "status": "measured",
                    "time_us": time_us,
                }
            )
            return True
        control = state.control(attempt)
        if control is None:
            result = stability_control(
                _context_lists(state, attempt, "2B", self.rounds),
                _context_lists(state, attempt, "B", self.rounds),
                self.request.settings.tolerance,
            )
            control = {
                "type": "control",
                "point": point.key,
                "attempt": attempt,
                "selected_us": result.selected_us,
                "control_us": result.control_us,
                "selected_pooled_us": result.selected_pooled_us,
                "control_pooled_us": result.control_pooled_us,
                "relative_change": result.relative_change,
                "tolerance": result.tolerance,
                "passed": result.passed,
                "sets": [self.meter.sets(point), 2 * self.meter.sets(point)],
            }
            log.append(control)
        if control["passed"]:
            log.append(
                {
                    "type": "point",
                    "point": point.key,
                    "attempt": attempt,
                    "status": "measured",
                    "time_us": control["selected_us"],
                }
            )
            return True
        return False

    def run(self) -> TargetOutcome:
        target = self.plan.target
        outcome = TargetOutcome(published=False, bundle=None, work_dir=self.work_dir)
        with writer_lock(self.work_dir):
            # A changed command is refused now, not after minutes of building the engine.
            SampleLog.check_resumable(
                self.work_dir,
                _identity(self.request, self.plan, self.backend, None, self.runtime),
            )
            self.progress.event("build", f"building {self.backend.name} for {target.deployment}")
            try:
                with self.clock.phase("build"):
                    session = self.backend.build(
                        self.request.model, target, self.runtime, self.request.dtype
                    )
                # Sub-phases the adapter timed inside its own build (engine start, traces).
                self.clock.move("build", getattr(session, "build_phases", None) or {})
            except AdapterRefusal:
                raise
            except Exception as exc:
                # Nothing is opened yet: the error is the whole story of this target.
                raise AcquisitionFailure(
                    f"building {self.backend.name} for {target.deployment} failed: "
                    f"{type(exc).__name__}: {exc}"
                ) from exc
            try:
                return self._measure_and_publish(session, outcome)
            finally:
                session.close()

    def _measure_and_publish(
        self, session: ComponentSession, outcome: TargetOutcome
    ) -> TargetOutcome:
        request, plan = self.request, self.plan
        settings = request.settings
        # Bytes one routed expert reads: its share of the bank's unique native storage.
        expert_bytes = max(1, session.expert_bank_bytes() // plan.geometry.local_experts)
        banks = physical_banks(
            (p.activated_experts for p in plan.points if p.is_expert),
            expert_bytes,
            self.runtime.cache_bytes,
            plan.geometry.local_experts,
            capacity_multiple=settings.capacity_multiple,
            minimum=settings.minimum_banks,
        )
        self.meter = PointMeter(
            session,
            settings,
            plan.geometry,
            plan.expert_map,
            expert_bytes=expert_bytes,
            cache_bytes=self.runtime.cache_bytes,
            device=request.device,
            clock=self.clock,
        )
        identity = _identity(request, plan, self.backend, banks, self.runtime)
        observations = {
            **self.runtime.observations(),
            "acquisition_version": acquisition.__version__,
            "command_line": request.command_line,
            "started_at": datetime.now(UTC).isoformat(timespec="seconds"),
            "admission": self.report.as_dict(),
        }
        with self.clock.phase("checkpoint"):
            log = SampleLog.open(self.work_dir, identity, observations)
        try:
            if log.archived is not None:
                self.progress.write(f"archived an incomplete trailing record to {log.archived}")
            (self.work_dir / "plan.json").write_text(
                json.dumps(plan.as_dict(), sort_keys=True) + "\n", encoding="utf-8"
            )
            pending = _queue_order(log, [p for p in plan.points if not log.state(p.key).measured])
            self.progress.skipped(len(plan.points) - len(pending))
            if pending:
                with self.clock.phase("banks"):
                    _check_memory(session, self.runtime, banks)
                    if any(p.is_expert for p in pending):
                        session.allocate_banks(banks)
                meter = self.meter
                self._precompile(session, pending)
                self.progress.event(
                    "measure",
                    f"{target_label(plan)}: {len(pending)} points to measure, {banks} weight banks",
                )
                self._measure_pending(log, meter, pending, outcome)
            if outcome.failed_points:
                return outcome
            with self.clock.phase("publish"):
                return self._publish(log, session, banks, outcome)
        finally:
            with self.clock.phase("checkpoint"):
                log.close()

    def _precompile(self, session: ComponentSession, pending: list[PlanPoint]) -> None:
        """Compile the expert kernels of every pending row count before the first point
        (issue 19): an optional session method (``vllm-modular``, ``vllm-live``); off with
        ``--triton-precompile-workers 0``. Measures nothing and changes no point's forwards."""
        workers = self.request.settings.precompile_workers
        precompile = getattr(session, "precompile", None)
        if workers < 1 or precompile is None:
            return
        first: dict[int, PlanPoint] = {}
        for point in pending:
            if point.is_expert:
                first.setdefault(point.tokens, point)
        if not first:
            return
        rows = sorted(first, reverse=True)  # the largest (slowest to compile) first
        with self.clock.phase("precompile"):
            stimuli = [self.meter.stimulus(first[r]) for r in rows]
            report = precompile(stimuli, workers, _kernel_configs(self.request, self.plan, rows))
        self.clock.note("precompile", report.as_dict())
        self.progress.write(
            f"{target_label(self.plan)}: precompiled {report.kernels or 'no kernels'} for "
            f"{len(rows)} expert row counts ({report.configs} configurations, "
            f"{report.compiled} compiled) in {report.seconds:.1f}s, {report.mode}"
            + (f" ({report.reason})" if report.reason else "")
        )

    def _advance(self, log: SampleLog, item: _Pending) -> PointRequest | bool:
        """The point's next step in this run: contexts to measure, or its verdict.

        Each decided attempt (measured, or read back after a kill before its verdict) uses
        one of ``--control-attempts``; a point that has used them all is recorded as failed.
        """
        point, state = item.point, log.state(item.point.key)
        attempt = 0
        while item.tries < self.request.settings.attempts:
            attempt, attempt_state = state.open_attempt()
            with self.clock.phase("statistics"):
                verdict = self.decide(log, point, attempt)
            if verdict is None:
                needed = tuple(
                    c for c in context_order(point, self.rounds) if c not in attempt_state.contexts
                )
                return PointRequest(point, attempt, needed, verify=not item.verified)
            item.tries += 1
            if verdict:
                return True
        log.append({"type": "point", "point": point.key, "attempt": attempt, "status": "failed"})
        return False

    def _measure_pending(
        self, log: SampleLog, meter: PointMeter, pending: list[PlanPoint], outcome: TargetOutcome
    ) -> None:
        """Measure points in batches sharing a profiler session; checkpoint once per batch.

        A point whose control fails goes to the end of the queue (``_measure_queue``), so its
        next attempt runs after the points not yet measured. Progress counts a point when it
        has its verdict, with the wall seconds of its share of each batch of each attempt.
        """
        queue = deque(_Pending(p) for p in pending)

        def finish(item: _Pending, measured: bool) -> None:
            if not measured:
                outcome.failed_points.append(item.point.key)
            outcome.measured_now += 1
            self.clock.measured()
            self.progress.measured(item.seconds, item.point.key, warm_up=item.warm_up)

        with frozen_heap() as heap:
            self._measure_queue(log, meter, queue, finish)
        self.clock.note("gc", heap.as_dict())
        reuse = getattr(meter.session, "workspace_reuse", None)
        if reuse is not None:
            # vllm-modular: vLLM workspace requests made and spared (hold_workspace).
            self.clock.note("workspace_views", {"requested": reuse[0], "reused": reuse[1]})

    def _measure_queue(
        self,
        log: SampleLog,
        meter: PointMeter,
        queue: deque[_Pending],
        finish: Callable[[_Pending, bool], None],
    ) -> None:
        settings = self.request.settings
        first = True
        while queue:
            batch: list[tuple[_Pending, PointRequest]] = []
            while queue and len(batch) < settings.batch_points:
                item = queue.popleft()
                step = self._advance(log, item)
                if isinstance(step, bool):
                    finish(item, step)
                else:
                    batch.append((item, step))
            if not batch:
                continue
            started = time.monotonic()
            try:
                done, _ = meter.measure_batch(
                    [request for _, request in batch], max_seconds=settings.batch_seconds
                )
            except PointError as exc:
                request = exc.request
                if isinstance(exc.cause, AttributionError):
                    trace = meter.export_trace(
                        self.work_dir / f"trace-{_safe(request.point.key)}-a{request.attempt}.json"
                    )
                    self.fail(
                        request.point, request.attempt, f"attribution failed: {exc.cause}", trace
                    )
                self.fail(request.point, request.attempt, str(exc.cause), None)
            records: list[dict[str, Any]] = []
            for (item, _), measurement in zip(batch, done, strict=False):
                request = measurement.request
                if measurement.checked:
                    item.verified = True
                    records.append(
                        {
                            "type": "reference_check",
                            "point": request.point.key,
                            "slots": measurement.checked,
                        }
                    )
                records += _records(request.point, request.attempt, measurement.results)
            # A stop waits until the batch's points are both in the checkpoint and counted, so
            # the cancelled event's count is the one a resume finds.
            with stop_deferred():
                with self.clock.phase("checkpoint"):
                    log.extend(records)
                    log.sync()
                share = (time.monotonic() - started) / len(done)
                retry: list[_Pending] = []
                for item, _ in batch[: len(done)]:
                    item.seconds += share
                    item.warm_up = item.warm_up or first
                    step = self._advance(log, item)
                    if isinstance(step, bool):
                        finish(item, step)
                    else:
                        retry.append(item)
            first = False
            # The points the batch's time limit left unmeasured go back to the head, in order.
            for item in reversed([item for item, _ in batch[len(done) :]]):
                queue.appendleft(item)
            # A failed control's next attempt goes to the END of the queue, after the points
            # not yet measured, not back to the head. On the H200 a point that failed once
            # (e.g. DP2/EP2 rank 1, whose forwards are bimodal) failed again when it was
            # measured at once, and passed in a later process: its attempts were correlated in
            # time. At the end, its attempts run at different moments of the run.
            #
            # No separate "late pass" is needed: the queue is first in, first out, so once the
            # points not yet measured are done it holds only retries, in the order they failed,
            # and each sweep measures every one of them once (round robin, ``batch_points`` at
            # a time). A point's consecutive attempts are then separated by every other
            # outstanding retry. Only a point that is the last one left runs its remaining
            # attempts back to back, as before: nothing else is left to measure in between,
            # and measuring anything else (or idling) would add device time without a datum.
            queue.extend(retry)

    def _publish(
        self, log: SampleLog, session: ComponentSession, banks: int, outcome: TargetOutcome
    ) -> TargetOutcome:
        request, plan = self.request, self.plan
        rows: list[Row] = []
        changes: list[float] = []
        for point in plan.points:
            state = log.state(point.key)
            rows.append(
                (
                    point.component,
                    "eager",
                    point.tokens,
                    point.activated_experts,
                    point.local_assignments,
                    state.time_us,
                )
            )
            if point.is_expert and state.result is not None:
                control = state.control(int(state.result["attempt"]))
                if control is not None:
                    changes.append(float(control["relative_change"]))
        # Provenance: the first session that measured anything, and every distinct later
        # observation set that added validated work (a no-op resume adds nothing).
        sessions = log.productive_sessions or [log.session]
        contexts: list[dict[str, Any]] = []
        for session_id in sessions:
            observed = log.observations(session_id)
            observed.pop("admission", None)
            if observed not in contexts:
                contexts.append(observed)
        first = log.observations(sessions[0])
        provenance = {**first, "acquisition_contexts": contexts}
        sets = sorted({self.meter.sets(p) for p in plan.points if p.is_expert})
        conditioning = {
            "expert_weight_bytes": session.expert_weight_bytes(),
            "expert_bank_bytes": session.expert_bank_bytes(),
            "expert_bytes": self.meter.expert_bytes,
            "cache_bytes": self.runtime.cache_bytes,
            "cache_source": self.runtime.cache_source,
            "banks": banks,
            "control_sets": {"min": sets[0], "max": sets[-1]},
        }
        contract = build_contract(request, plan, session.describe(), conditioning, provenance)
        coverage = build_coverage(plan, self.rounds, changes, failed_points=0)
        self.progress.event(
            "publish", f"writing {plan.target.deployment} into {request.bundle_dir}"
        )
        # The evidence beside the table: every control of the published points, read back
        # from the checkpoint as a resume would, and the backend's traced native forwards.
        with log.path.open(encoding="utf-8") as handle:
            stability = stability_rows(json.loads(line) for line in handle)
        conservation, absent = conservation_evidence(contract["backend"])
        publish_target(
            request,
            plan,
            rows,
            contract,
            coverage,
            stability=stability,
            conservation=conservation,
            conservation_absent=absent,
        )
        outcome.published = True
        outcome.bundle = request.bundle_dir
        return outcome


def _kernel_configs(request: AcquisitionRequest, plan: PointPlan, rows: list[int]) -> int | None:
    """Distinct (Triton configuration, naive assignment) pairs these expert rows select, from
    ``moetables.triton_config`` (None where the kernel's configuration is not modelled)."""
    from acquisition.plan.kernel import KernelSteps, KernelStepsError

    kernel = plan.kernel
    if kernel is None:
        try:
            kernel = KernelSteps.for_target(
                hardware=request.hardware,
                dtype=request.dtype,
                local_experts=plan.geometry.local_experts,
                global_experts=plan.geometry.global_experts,
                top_k=plan.geometry.top_k,
                width=request.model.expert_intermediate_size,
                quantization=request.model.quantization,
                weight_block=request.model.weight_block_size,
            )
        except KernelStepsError:
            return None
    return len({kernel.kernel(r) for r in rows})


def target_label(plan: PointPlan) -> str:
    return f"tp{plan.target.tp}/{plan.target.deployment}"


def acquire_target(
    request: AcquisitionRequest,
    plan: PointPlan,
    backend: ComponentBackend,
    runtime: RuntimeInfo,
    report: AdmissionReport,
    progress: ProgressReporter,
    clock: PhaseClock | None = None,
) -> TargetOutcome:
    """Measure (or resume) one target and publish it into the bundle once complete."""
    progress.set_target(target_label(plan))
    clock = clock if clock is not None else PhaseClock()
    clock.set_target(target_label(plan))
    try:
        return _TargetRun(request, plan, backend, runtime, report, progress, clock).run()
    finally:
        clock.set_target("run")
        release_target_memory(request.device)


@dataclass
class HeapStats:
    """The cyclic collector during one target's measuring loop (the phase log's ``gc`` note)."""

    frozen: int = 0
    # Tracked objects the loop left alive (not frozen) when it ended: whether the heap grew.
    grown: int = 0
    collections: list[int] = field(default_factory=lambda: [0, 0, 0])
    seconds: float = 0.0
    _started: float = 0.0

    def callback(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
            return
        self.seconds += time.perf_counter() - self._started
        generation = int(info.get("generation", 0))
        if 0 <= generation < len(self.collections):
            self.collections[generation] += 1

    def as_dict(self) -> dict[str, Any]:
        return {
            "frozen_objects": self.frozen,
            "objects_after": self.grown,
            "collections": list(self.collections),
            "seconds": round(self.seconds, 4),
        }


@contextlib.contextmanager
def frozen_heap() -> Iterator[HeapStats]:
    """The measuring loop with the objects that exist before it out of the cyclic collector.

    After torch and vLLM are imported and a session is built the heap holds a million or more
    objects, and each batch's trace reading and attribution allocate tens of thousands more
    that live until the batch is attributed; every full collection the collector starts then
    walks the whole heap, on the host thread that issues the forwards (issue 19). Frozen, the
    old objects are skipped; they are unfrozen when the loop ends, so ``release_target_memory``
    still collects a finished target's cycles. Host-side only: no forward, launch or recorded
    activity changes. A process that froze objects of its own is left as it is. The stats
    yielded count the collections and their seconds inside the loop.
    """
    stats = HeapStats()
    gc.callbacks.append(stats.callback)
    try:
        if gc.get_freeze_count() > 0:
            yield stats
            return
        gc.freeze()
        stats.frozen = gc.get_freeze_count()
        try:
            yield stats
        finally:
            stats.grown = len(gc.get_objects())  # the unfrozen ones only
            gc.unfreeze()
    finally:
        gc.callbacks.remove(stats.callback)


def release_target_memory(device: str) -> None:
    """Free what the finished target held before the next one builds.

    A session's banks, base weights, modular kernel and workspaces can sit in reference
    cycles (closures, exit stacks), which only the cyclic collector frees, at a time of its
    choosing; until then the next target's tensors are placed around them, and the caching
    allocator keeps the freed blocks reserved. Collecting and emptying the cache here gives
    every target the same starting device state, whatever came before it (issue: later
    ranks of one process measured slower than the same ranks in a fresh process).
    """
    gc.collect()
    torch = sys.modules.get("torch")
    if device == "cuda" and torch is not None and torch.cuda.is_initialized():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
