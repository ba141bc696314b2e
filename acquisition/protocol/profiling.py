"""Reading torch.profiler into a ``ProfiledWindow``: the only place the protocol meets kineto.

On CUDA, device activities are kernels, copies and sets; their launches are the host's CUDA
runtime and driver calls with the same correlation id (``cudaLaunchKernel``,
``cuLaunchKernel``, ``cudaMemcpyAsync``...). On CPU there is no device timeline, so CPU
operator events are read instead. Event kinds come from ``activity_type()`` where this torch
has it, and otherwise from the event's device and name (torch 2.11 lacks the method).
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
from typing import TYPE_CHECKING, Any

from acquisition.phases import PhaseClock
from acquisition.protocol.attribution import DeviceActivity, HostCall, ProfiledWindow, TimedRange

if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence
    from pathlib import Path
    from types import TracebackType

__all__ = ["RANGE_PREFIX", "ProfilerCapture", "read_cuda_window"]

RANGE_PREFIX = "acq:"
_LAUNCH_KINDS = {"cuda_runtime", "cuda_driver"}
_OPERATOR_KINDS = {"cpu_op"}


class ProfilerCapture:
    """One profiler session; ``region(name)`` marks a timed call inside it.

    ``paused()`` stops collection around untimed work (warmup forwards) where this torch can
    toggle collection; that halves the events to read without a profiler restart per context.
    """

    def __init__(
        self,
        device: str,
        clock: PhaseClock | None = None,
        *,
        ranges_only: bool | None = None,
        streams: bool = False,
    ) -> None:
        """``ranges_only``: record only ``record_function`` ranges among host events (no
        operators); default: on CUDA where ``host_ranges_only_works`` says this torch can.
        ``streams``: read each device activity's stream too (one more field per activity, so
        only the ownership traces ask for it, not the timed windows)."""
        import torch

        self._torch = torch
        self.device = device
        self.clock = clock if clock is not None else PhaseClock()
        if ranges_only is None:
            ranges_only = device == "cuda" and host_ranges_only_works()
        self.ranges_only = ranges_only
        self.streams = streams
        activities = [torch.profiler.ProfilerActivity.CPU]
        if device == "cuda":
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        self._activities = activities
        self._profile = torch.profiler.profile(
            activities=activities, record_shapes=False, with_stack=False, profile_memory=False
        )
        self.can_pause = hasattr(self._profile, "toggle_collection_dynamic")

    def __enter__(self) -> ProfilerCapture:
        with self.clock.phase("profiler_start"), _quiet_native_stderr():
            if self.ranges_only:
                with _user_scopes_only(self._torch):
                    self._profile.__enter__()  # type: ignore[no-untyped-call]
            else:
                self._profile.__enter__()  # type: ignore[no-untyped-call]
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        with self.clock.phase("profiler_stop"):
            self._drain()
            with _quiet_native_stderr():
                self._profile.__exit__(kind, value, traceback)  # type: ignore[no-untyped-call]

    def _drain(self) -> None:
        if self.device == "cuda":
            # Every launched activity must have finished, and so been recorded, first.
            self._torch.cuda.synchronize()

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Run untimed work without collecting it (collected anyway where unsupported)."""
        if not self.can_pause:
            yield
            return
        with self.clock.phase("profiler_toggle"):
            self._drain()
            with _quiet_native_stderr():
                self._profile.toggle_collection_dynamic(False, self._activities)
        try:
            yield
        finally:
            with self.clock.phase("profiler_toggle"):
                self._drain()
                with _quiet_native_stderr():
                    self._profile.toggle_collection_dynamic(True, self._activities)

    @contextlib.contextmanager
    def region(self, name: str) -> Iterator[None]:
        with self._torch.profiler.record_function(RANGE_PREFIX + name):
            yield

    def export_chrome_trace(self, path: Path) -> None:
        self._profile.export_chrome_trace(str(path))

    def window(self) -> ProfiledWindow:
        """Ranges, launches and device activities (CUDA), or ranges and operators (CPU)."""
        with self.clock.phase("trace_collection"):
            results = self._profile.profiler.kineto_results  # type: ignore[union-attr]
            events = results.events()  # type: ignore[union-attr]
            if self.device == "cuda":
                return read_cuda_window(events, streams=self.streams)
            window = ProfiledWindow()
            for event in events:
                _classify(event, window)
            return window


@contextlib.contextmanager
def _user_scopes_only(torch: Any) -> Iterator[None]:
    """Start the profiler with its host callbacks limited to ``record_function`` ranges.

    On CUDA, attribution reads the timed ranges, the CUDA runtime and driver calls (which
    CUPTI reports, not the operator callbacks) and the device activities: operator events are
    never read, yet recording them costs every aten call of every forward. torch's profiler
    takes the callback scopes as an argument of its private ``_enable_profiler``, which the
    public class does not pass; it is supplied here for the start call only, and
    ``host_ranges_only_works`` checks once per process that the result is what attribution
    needs (otherwise every operator is recorded, as before).
    """
    module = torch.autograd.profiler
    original = module._enable_profiler
    scopes = {torch._C._profiler.RecordScope.USER_SCOPE}

    def enable(config: Any, activities: Any, *_: Any) -> Any:
        return original(config, activities, scopes)

    module._enable_profiler = enable
    try:
        yield
    finally:
        module._enable_profiler = original


@functools.cache
def host_ranges_only_works() -> bool:
    """Whether a ranges-only CUDA session still yields ranges, launches and kernels that
    attribute exactly (checked once per process on a tiny probe), and drops operators."""
    import torch

    from acquisition.protocol.attribution import AttributionError, attribute_launches

    if not torch.cuda.is_available():
        return False
    try:
        x = torch.ones(64, 64, device="cuda")
        torch.cuda.synchronize()
        capture = ProfilerCapture("cuda", ranges_only=True)
        with capture:
            for i in range(2):
                with capture.region(f"probe.f{i}"):
                    torch.mm(x, x)
        window = capture.window()
        attribution = attribute_launches(window)
        operators = len(
            [
                event
                for event in capture._profile.profiler.kineto_results.events()  # type: ignore[union-attr]
                if str(event.device_type()).endswith("CPU")
                and not event.is_user_annotation()
                and (_kind(event) in _OPERATOR_KINDS or event.name().startswith("aten::"))
            ]
        )
    except (AttributionError, RuntimeError, TypeError, AttributeError):
        return False
    return (
        operators == 0
        and sorted(r.name for r in window.ranges) == ["probe.f0", "probe.f1"]
        and all(count >= 1 for count in attribution.per_range_count.values())
    )


@contextlib.contextmanager
def _quiet_native_stderr() -> Iterator[None]:
    """Silence native stderr while kineto starts, stops or toggles.

    This kineto prints "USDT ... profiler_start/profiler_stop" lines on every session (and a
    warning on every toggle) whatever KINETO_LOG_LEVEL says; thousands of them would bury the
    progress bar. Python-level errors still propagate as exceptions.
    """
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "wb") as sink:
            os.dup2(sink.fileno(), 2)
            try:
                yield
            finally:
                os.dup2(saved, 2)
    finally:
        os.close(saved)


def _kind(event: Any) -> str | None:
    getter = getattr(event, "activity_type", None)
    if getter is None:
        return None
    try:
        return str(getter())
    except (RuntimeError, TypeError):
        return None


def _host_call(event: Any, name: str, correlation: int | None = None) -> HostCall:
    start = int(event.start_ns())
    return HostCall(
        name=name,
        thread=int(event.start_thread_id()),
        start_ns=start,
        end_ns=start + int(event.duration_ns()),
        correlation=int(event.correlation_id()) if correlation is None else correlation,
    )


def read_cuda_window(events: Sequence[Any], *, streams: bool = False) -> ProfiledWindow:
    """A CUDA window read lean: what ``attribute_launches`` consults, nothing more.

    Hundreds of thousands of events per batch, each field a native call: whether an event's
    device type is the host is decided once per type value (formatting the enum to a string
    per event cost more than reading the event), an event's name is read once, and a host call
    becomes a ``HostCall`` only if some device activity of the window carries its correlation
    id. Attribution looks launches up by the correlation ids of activities, so the calls
    dropped here (``cudaStreamIsCapturing``, event records, launches whose activity was not
    recorded) are never consulted: the attribution is the same, with its ownership and
    conservation checks (R15).
    """
    window = ProfiledWindow()
    activities = window.activities
    ranges = window.ranges
    candidates: list[tuple[Any, str, int]] = []
    kind_of = None
    hosts: dict[Any, bool] = {}
    for event in events:
        device = event.device_type()
        on_host = hosts.get(device)
        if on_host is None:
            on_host = hosts[device] = str(device).endswith("CPU")
        if not on_host:
            if event.is_user_annotation():
                continue  # the GPU copy of a record_function range, not an activity
            activities.append(
                DeviceActivity(
                    name=event.name(),
                    start_ns=int(event.start_ns()),
                    duration_ns=int(event.duration_ns()),
                    correlation=int(event.correlation_id()),
                    # Kineto's resource id of a CUDA activity is its stream (read on request:
                    # one more native call per activity).
                    stream=int(event.device_resource_id()) if streams else 0,
                )
            )
            continue
        name = event.name()
        if name.startswith(RANGE_PREFIX):
            if event.is_user_annotation():
                call = _host_call(event, name[len(RANGE_PREFIX) :])
                ranges.append(TimedRange(call.name, call.thread, call.start_ns, call.end_ns))
            continue
        if kind_of is None:
            kind_of = _kind if hasattr(type(event), "activity_type") else _no_kind
        kind = kind_of(event)
        if kind in _LAUNCH_KINDS if kind is not None else name.startswith("cu"):
            candidates.append((event, name, int(event.correlation_id())))
    launched = {activity.correlation for activity in activities}
    window.launches.extend(
        _host_call(event, name, correlation)
        for event, name, correlation in candidates
        if correlation in launched
    )
    return window


def _no_kind(event: Any) -> str | None:
    return None


def _classify(event: Any, window: ProfiledWindow) -> None:
    """One event of a CPU window (ranges and operators); CUDA windows use ``read_cuda_window``."""
    name = event.name()
    if not str(event.device_type()).endswith("CPU"):
        return
    if name.startswith(RANGE_PREFIX):
        if event.is_user_annotation():
            call = _host_call(event, name[len(RANGE_PREFIX) :])
            window.ranges.append(TimedRange(call.name, call.thread, call.start_ns, call.end_ns))
        return
    kind = _kind(event)
    if (kind is None or kind in _OPERATOR_KINDS) and not event.is_user_annotation():
        window.operators.append(_host_call(event, name))
