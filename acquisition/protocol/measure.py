"""Measuring one planned point with a component session: contexts, arms, banks, attribution.

Eager only (R14). A point is measured in independent contexts (``--moe-rounds``), each with
its own warmup and at least ``--measurement-iterations`` timed forwards; one profiler
session covers all contexts of a point and every timed forward has its own range, so each
forward's time is the sum of its own activities (R15, R16). Expert points run the B and 2B
arms in every round, alternating which goes first, over whole bank cycles (R17, R18). Before
any timing, every bank the point will use is compared exactly with the eager reference on the
point's routing stimulus (R19); local components are compared with their reference too.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from acquisition.phases import PhaseClock
from acquisition.protocol.attribution import (
    Attribution,
    AttributionError,
    attribute_launches,
    attribute_operators,
)
from acquisition.protocol.banks import ArmSchedule, arm_schedules, weight_set, weight_sets
from acquisition.protocol.profiling import ProfilerCapture
from acquisition.protocol.stimulus import RoutingStimulus, routing_stimulus

if TYPE_CHECKING:
    from collections.abc import Sequence
    from pathlib import Path

    from acquisition.adapters.base import ComponentSession
    from acquisition.plan import PlanPoint
    from moetables.geometry import ExpertGeometry

__all__ = [
    "ContextResult",
    "PointError",
    "PointMeasurement",
    "PointMeter",
    "PointRequest",
    "ProtocolSettings",
    "ReferenceMismatch",
    "context_order",
]

LOCAL_ARM = "local"


class ReferenceMismatch(RuntimeError):
    """A bank or component output differs from its eager reference: nothing is timed."""


@dataclass(frozen=True, slots=True)
class ProtocolSettings:
    rounds: int
    iterations: int
    warmup_cycles: int = 1
    local_warmup: int = 2
    tolerance: float = 0.03
    capacity_multiple: int = 2
    minimum_banks: int = 2
    attempts: int = 6
    # Operational, like attempts: points sharing one profiler session, and the wall seconds
    # after which a batch closes (its records are written when it closes).
    batch_points: int = 8
    batch_seconds: float = 1.0
    # Operational: threads compiling Triton's expert kernels before a target's measuring loop
    # (issue 19; 0: each configuration compiles at first use, inside a point, as before).
    precompile_workers: int = 8

    def __post_init__(self) -> None:
        if self.rounds < 1 or self.iterations < 1:
            raise ValueError("--moe-rounds and --measurement-iterations must be at least 1")
        if self.warmup_cycles < 0 or self.local_warmup < 0 or self.attempts < 1:
            raise ValueError("warmup counts must not be negative; attempts at least 1")
        if self.batch_points < 1 or not self.batch_seconds > 0:
            raise ValueError("a profiler batch holds at least one point and a positive time")
        if self.precompile_workers < 0:
            raise ValueError("--triton-precompile-workers must not be negative")
        if not 0 < self.tolerance < 1:
            raise ValueError(f"the quality tolerance must be in (0, 1), got {self.tolerance}")

    def identity(self) -> dict[str, Any]:
        """The settings a resumed acquisition must keep (attempts are operational)."""
        return {
            "rounds": self.rounds,
            "iterations": self.iterations,
            "warmup_cycles": self.warmup_cycles,
            "local_warmup": self.local_warmup,
            "quality_relative_tolerance": self.tolerance,
            "capacity_multiple": self.capacity_multiple,
            "minimum_banks": self.minimum_banks,
        }


@dataclass(frozen=True, slots=True)
class ContextResult:
    arm: str
    round: int
    sets: int
    forwards_us: tuple[float, ...]


def context_order(point: PlanPoint, rounds: int) -> list[tuple[str, int]]:
    """Every (arm, round) of a point in measuring order; arms alternate which runs first."""
    if not point.is_expert:
        return [(LOCAL_ARM, r) for r in range(rounds)]
    order: list[tuple[str, int]] = []
    for r in range(rounds):
        arms = ("B", "2B") if r % 2 == 0 else ("2B", "B")
        order.extend((arm, r) for arm in arms)
    return order


@dataclass(frozen=True, slots=True)
class PointRequest:
    """The contexts of one point (and attempt) to measure; ``verify`` checks the reference."""

    point: PlanPoint
    attempt: int
    contexts: tuple[tuple[str, int], ...]
    verify: bool


@dataclass(frozen=True, slots=True)
class PointMeasurement:
    request: PointRequest
    results: list[ContextResult]
    checked: int


class PointError(RuntimeError):
    """A point of a batch failed (attribution or reference); ``cause`` says how."""

    def __init__(self, request: PointRequest, cause: Exception) -> None:
        super().__init__(f"{request.point.key}: {cause}")
        self.request = request
        self.cause = cause


class _Forward:
    """One timed forward of a point: a weight set of the arm's cycle, or the local component."""

    def __init__(
        self, session: ComponentSession, *, slots: list[tuple[int, Any]] | None = None,
        local: Any = None,
    ) -> None:  # fmt: skip
        self.session = session
        self.slots = slots
        self.local = local

    def __call__(self, arm: ArmSchedule, i: int) -> None:
        if self.slots is None:
            self.local.run()
            return
        bank, prepared = self.slots[arm.set_of(i)]
        self.session.run_experts(prepared, bank)


def _range_name(index: int, point: PlanPoint, arm: str, round_index: int, j: int) -> str:
    # The batch position first (unique, and how a failure finds its point), then what a
    # person reading a failure trace wants to see.
    return f"{index}|{point.key}|{arm}.r{round_index}.f{j}"


def _blamed(requests: Sequence[PointRequest], exc: AttributionError) -> PointRequest:
    """The point a window-wide attribution failure names (the first of the batch if none)."""
    for name in exc.ranges:
        head = name.split("|", 1)[0]
        if head.isdigit() and int(head) < len(requests):
            return requests[int(head)]
    return requests[0]


def _context_results(
    index: int,
    request: PointRequest,
    schedules: dict[str, ArmSchedule],
    attribution: Attribution,
) -> list[ContextResult]:
    point = request.point
    results = []
    for arm_label, round_index in request.contexts:
        arm = schedules[arm_label]
        names = [_range_name(index, point, arm_label, round_index, j) for j in range(arm.timed)]
        counts = {attribution.per_range_count[n] for n in names}
        if len(counts) != 1:
            # The forwards of a context run identical work; a forward with fewer
            # activities lost some (or gained another's): never average over that.
            raise AttributionError(
                f"{point.key} {arm_label} round {round_index}: forwards own different "
                f"activity counts {sorted(counts)}",
                ranges=names,
            )
        times = tuple(attribution.range_us(n) for n in names)
        results.append(ContextResult(arm_label, round_index, arm.sets, times))
    return results


def _equal_flag(left: Any, right: Any) -> Any:
    """``torch.equal`` as a device boolean (no synchronisation); False for other shapes."""
    if left.shape != right.shape or left.dtype != right.dtype or left.device != right.device:
        return False
    return (left == right).all()


def _read_flags(flags: list[Any]) -> list[bool]:
    """Device booleans read back with one synchronisation."""
    import torch

    tensors = [f for f in flags if not isinstance(f, bool)]
    values = iter(torch.stack(tensors).tolist() if tensors else [])
    return [f if isinstance(f, bool) else bool(next(values)) for f in flags]


def _exactly_equal(left: Any, right: Any) -> bool:
    import torch

    if isinstance(left, tuple | list):
        return len(left) == len(right) and all(
            _exactly_equal(a, b) for a, b in zip(left, right, strict=True)
        )
    return bool(torch.equal(left, right))


class PointMeter:
    """Measures points of one target with one session and its cloned weight banks."""

    def __init__(
        self,
        session: ComponentSession,
        settings: ProtocolSettings,
        geometry: ExpertGeometry,
        expert_map: Sequence[int],
        *,
        device: str,
        expert_bytes: int | None = None,
        cache_bytes: int | None = None,
        banks: int | None = None,
        clock: PhaseClock | None = None,
    ) -> None:
        """Give ``expert_bytes`` and ``cache_bytes`` to derive B per point (the acquisition),
        or a fixed ``banks`` = B for every point (tests driving a session directly)."""
        if banks is None and (expert_bytes is None or cache_bytes is None):
            raise ValueError("PointMeter needs expert_bytes and cache_bytes, or a fixed banks")
        self.session = session
        self.settings = settings
        self.geometry = geometry
        self.expert_map = list(expert_map)
        self.expert_bytes = expert_bytes or 0
        self.cache_bytes = cache_bytes or 0
        self.fixed_sets = banks
        self.device = device
        self.clock = clock if clock is not None else PhaseClock()
        self.last_capture: ProfilerCapture | None = None

    def sets(self, point: PlanPoint) -> int:
        """B of an expert point: weight sets of its A experts that overflow the cache."""
        if self.fixed_sets is not None:
            return self.fixed_sets
        return weight_sets(
            point.activated_experts,
            self.expert_bytes,
            self.cache_bytes,
            capacity_multiple=self.settings.capacity_multiple,
            minimum=self.settings.minimum_banks,
        )

    def arms(self, point: PlanPoint) -> dict[str, ArmSchedule]:
        if not point.is_expert:
            return {
                LOCAL_ARM: ArmSchedule(
                    LOCAL_ARM,
                    sets=1,
                    warmup=self.settings.local_warmup,
                    timed=self.settings.iterations,
                )
            }
        control, selected = arm_schedules(
            self.sets(point), self.settings.iterations, self.settings.warmup_cycles
        )
        return {control.label: control, selected.label: selected}

    def stimulus(self, point: PlanPoint) -> RoutingStimulus:
        """The point's routing; a pure function of the point, so every run meets the same one."""
        return routing_stimulus(
            self.geometry,
            self.expert_map,
            point.tokens,
            point.activated_experts,
            point.local_assignments,
            seed=point.tokens * 1_000_003
            + point.activated_experts * 1009
            + point.local_assignments,
        )

    def _expert_slots(self, point: PlanPoint) -> list[tuple[int, Any]]:
        """(bank, prepared inputs) of every weight set of the 2B arm."""
        base = self.stimulus(point)
        slots = []
        for index in range(2 * self.sets(point)):
            where = weight_set(index, point.activated_experts, self.geometry.local_experts)
            prepared = self.session.prepare_experts(base.rotated(self.expert_map, where.offset))
            slots.append((where.bank, prepared))
        return slots

    def verify(self, point: PlanPoint, slots: list[tuple[int, Any]] | None = None) -> int:
        """Compare every weight set (or the local component) with its reference; sets checked.

        Expert sets are compared on the device in stream order (each comparison is queued
        right after its two outputs, before the next set can reuse a workspace) and read back
        with one synchronisation for the whole point, not one per set.
        """
        if not point.is_expert:
            forward = self.session.local_forward(point.component, point.tokens)
            if not _exactly_equal(forward.run(), forward.reference()):
                raise ReferenceMismatch(f"{point.key}: output differs from its eager reference")
            return 1
        slots = slots if slots is not None else self._expert_slots(point)
        flags: list[Any] = []
        for bank, prepared in slots:
            output = self.session.run_experts(prepared, bank)
            flags.append(_equal_flag(output, self.session.reference_experts(prepared)))
        for index, equal in enumerate(_read_flags(flags)):
            if not equal:
                raise ReferenceMismatch(
                    f"{point.key}: weight set {index} (bank {slots[index][0]}) output differs "
                    "from the cloned eager reference"
                )
        self.session.synchronize()
        return len(slots)

    def measure(
        self, point: PlanPoint, contexts: Sequence[tuple[str, int]], *, verify: bool
    ) -> tuple[list[ContextResult], Attribution, int]:
        """Time ``contexts`` of ``point`` in a session of its own (a batch of one)."""
        try:
            (done,), attribution = self.measure_batch(
                [PointRequest(point, 0, tuple(contexts), verify)]
            )
        except PointError as exc:
            raise exc.cause from None
        return list(done.results), attribution, done.checked

    def measure_batch(
        self, requests: Sequence[PointRequest], *, max_seconds: float | None = None
    ) -> tuple[list[PointMeasurement], Attribution]:
        """Time the contexts of several points inside one profiler session.

        Starting and stopping kineto costs milliseconds per session and a point's own work
        can be less, so consecutive points share a session; each forward still has its own
        range, named after its point, so attribution is per forward as before. A point's
        inputs are prepared and checked against the reference while collection is paused for
        its first context's warmup, so the batch adds no pause of its own. With
        ``max_seconds`` the batch stops after the point that crosses it (the checkpoint is
        written per batch); the measurements returned are a prefix of ``requests``.
        Failures raise ``PointError`` naming the point.
        """
        clock = self.clock
        with clock.phase("profiler_start"):
            self.session.synchronize()
            capture = ProfilerCapture(self.device, clock)
        self.last_capture = capture
        measured: list[tuple[PointRequest, dict[str, ArmSchedule], int]] = []
        started = time.monotonic()
        with capture:
            for index, request in enumerate(requests):
                measured.append(self._run_contexts(capture, index, request))
                if max_seconds is not None and time.monotonic() - started >= max_seconds:
                    break
        window = capture.window()
        with clock.phase("attribution"):
            try:
                attribution = (
                    attribute_launches(window)
                    if self.device == "cuda"
                    else attribute_operators(window)
                )
            except AttributionError as exc:
                raise PointError(_blamed(requests, exc), exc) from exc
            results = []
            for index, (request, schedules, checked) in enumerate(measured):
                try:
                    contexts = _context_results(index, request, schedules, attribution)
                except AttributionError as exc:
                    raise PointError(request, exc) from exc
                results.append(PointMeasurement(request, contexts, checked))
        return results, attribution

    def _run_contexts(
        self, capture: ProfilerCapture, index: int, request: PointRequest
    ) -> tuple[PointRequest, dict[str, ArmSchedule], int]:
        clock, point = self.clock, request.point
        schedules = self.arms(point)
        checked = 0
        forward: Any = None
        for position, (arm_label, round_index) in enumerate(request.contexts):
            arm = schedules[arm_label]
            with self._context_hold(point):
                with capture.paused():
                    if position == 0:
                        with clock.phase("stimulus"):
                            forward = self._forward(point)
                        if request.verify:
                            with clock.phase("reference_check"):
                                try:
                                    checked = self.verify(point, forward.slots)
                                except ReferenceMismatch as exc:
                                    raise PointError(request, exc) from exc
                    with clock.phase("warmup"):
                        for i in range(arm.warmup):
                            forward(arm, i)
                with clock.phase("timed_forwards"):
                    for j in range(arm.timed):
                        with capture.region(_range_name(index, point, arm_label, round_index, j)):
                            forward(arm, arm.warmup + j)
        return request, schedules, checked

    def _context_hold(self, point: PlanPoint) -> contextlib.AbstractContextManager[Any]:
        """One context's expert forwards, held together by the session where it can (issue 19).

        A session with ``hold_workspace`` (vllm-modular) asks its library for the forward's
        workspace once per context instead of once per forward; every forward still launches
        the same device work with the same arguments (the session says why), so nothing
        measured changes. Other sessions, and local components, run as before.
        """
        hold = getattr(self.session, "hold_workspace", None)
        if hold is None or not point.is_expert:
            return contextlib.nullcontext()
        return cast("contextlib.AbstractContextManager[Any]", hold())

    def _forward(self, point: PlanPoint) -> _Forward:
        if point.is_expert:
            return _Forward(self.session, slots=self._expert_slots(point))
        return _Forward(
            self.session, local=self.session.local_forward(point.component, point.tokens)
        )

    def export_trace(self, path: Path) -> Path | None:
        """The last capture as a Chrome trace, for a failed attribution (R37)."""
        if self.last_capture is None:
            return None
        self.last_capture.export_chrome_trace(path)
        return path
