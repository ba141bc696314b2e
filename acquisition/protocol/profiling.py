"""Reading torch.profiler into a ``ProfiledWindow``: the only place the protocol meets kineto.

On CUDA, device activities are kernels, copies and sets; their launches are the host's CUDA
runtime and driver calls with the same correlation id (``cudaLaunchKernel``,
``cuLaunchKernel``, ``cudaMemcpyAsync``...). On CPU there is no device timeline, so CPU
operator events are read instead. Event kinds come from ``activity_type()`` where this torch
has it, and otherwise from the event's device and name (torch 2.11 lacks the method).
"""

from __future__ import annotations

import contextlib
import os
import sys
from typing import TYPE_CHECKING, Any

from acquisition.protocol.attribution import DeviceActivity, HostCall, ProfiledWindow, TimedRange

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path
    from types import TracebackType

__all__ = ["RANGE_PREFIX", "ProfilerCapture"]

RANGE_PREFIX = "acq:"
_LAUNCH_KINDS = {"cuda_runtime", "cuda_driver"}
_OPERATOR_KINDS = {"cpu_op"}


class ProfilerCapture:
    """One profiler session; ``region(name)`` marks a timed call inside it.

    ``paused()`` stops collection around untimed work (warmup forwards) where this torch can
    toggle collection; that halves the events to read without a profiler restart per context.
    """

    def __init__(self, device: str) -> None:
        import torch

        self._torch = torch
        self.device = device
        activities = [torch.profiler.ProfilerActivity.CPU]
        if device == "cuda":
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        self._activities = activities
        self._profile = torch.profiler.profile(
            activities=activities, record_shapes=False, with_stack=False, profile_memory=False
        )
        self.can_pause = hasattr(self._profile, "toggle_collection_dynamic")

    def __enter__(self) -> ProfilerCapture:
        with _quiet_native_stderr():
            self._profile.__enter__()  # type: ignore[no-untyped-call]
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
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
        self._drain()
        with _quiet_native_stderr():
            self._profile.toggle_collection_dynamic(False, self._activities)
        try:
            yield
        finally:
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
        results = self._profile.profiler.kineto_results  # type: ignore[union-attr]
        window = ProfiledWindow()
        cuda = self.device == "cuda"
        for event in results.events():  # type: ignore[union-attr]
            _classify(event, window, cuda=cuda)
        return window


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


def _host_call(event: Any, name: str) -> HostCall:
    start = int(event.start_ns())
    return HostCall(
        name=name,
        thread=int(event.start_thread_id()),
        start_ns=start,
        end_ns=start + int(event.duration_ns()),
        correlation=int(event.correlation_id()),
    )


def _classify(event: Any, window: ProfiledWindow, *, cuda: bool) -> None:
    # Hundreds of thousands of events per point: read as few fields as each kind needs.
    name = event.name()
    if not str(event.device_type()).endswith("CPU"):
        if event.is_user_annotation():
            return  # the GPU copy of a record_function range, not an activity
        window.activities.append(
            DeviceActivity(
                name=name,
                start_ns=int(event.start_ns()),
                duration_ns=int(event.duration_ns()),
                correlation=int(event.correlation_id()),
            )
        )
        return
    if name.startswith(RANGE_PREFIX):
        if event.is_user_annotation():
            call = _host_call(event, name[len(RANGE_PREFIX) :])
            window.ranges.append(TimedRange(call.name, call.thread, call.start_ns, call.end_ns))
        return
    kind = _kind(event)
    if cuda:
        # CPU operators are not needed on CUDA: ownership follows the launch calls.
        is_launch = kind in _LAUNCH_KINDS if kind is not None else name.startswith("cu")
        if is_launch:
            window.launches.append(_host_call(event, name))
        return
    if (kind is None or kind in _OPERATOR_KINDS) and not event.is_user_annotation():
        window.operators.append(_host_call(event, name))
