"""The lean CUDA trace reader (issue 19): the same attribution from fewer objects (R15).

Kineto's CUDA events are faked here (no GPU on CI): the reader only calls their accessors.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from acquisition.protocol.attribution import (
    AttributionError,
    HostCall,
    ProfiledWindow,
    attribute_launches,
)
from acquisition.protocol.profiling import RANGE_PREFIX, read_cuda_window

HOST, GPU = "DeviceType.CPU", "DeviceType.CUDA"


@dataclass
class FakeEvent:
    device: str
    label: str
    start: int
    duration: int
    correlation: int = 0
    annotation: bool = False
    thread: int = 7

    def device_type(self) -> str:
        return self.device

    def is_user_annotation(self) -> bool:
        return self.annotation

    def name(self) -> str:
        return self.label

    def start_ns(self) -> int:
        return self.start

    def duration_ns(self) -> int:
        return self.duration

    def correlation_id(self) -> int:
        return self.correlation

    def start_thread_id(self) -> int:
        return self.thread


@dataclass
class KindedEvent(FakeEvent):
    kind: str = "cpu_op"

    def activity_type(self) -> str:
        return self.kind


def forward_events(cls: type[FakeEvent] = FakeEvent) -> list[FakeEvent]:
    """Two timed forwards; each launches two kernels (runtime + driver on the second), with
    non-launch runtime calls around them, warmup kernels outside any range and the GPU copy
    of each range."""

    def host(label: str, start: int, duration: int, correlation: int = 0) -> FakeEvent:
        if cls is KindedEvent:
            kind = "cuda_driver" if label.startswith("cuLaunch") else "cuda_runtime"
            return KindedEvent(HOST, label, start, duration, correlation, kind=kind)
        return cls(HOST, label, start, duration, correlation)

    events: list[FakeEvent] = [
        host("cudaLaunchKernel", 10, 2, correlation=1),  # warmup, outside every range
        cls(GPU, "warm", 40, 5, correlation=1),
    ]
    for f, base in enumerate((100, 300)):
        c = 10 * (f + 1)
        events += [
            cls(HOST, f"{RANGE_PREFIX}p.f{f}", base, 100, annotation=True),
            cls(GPU, f"{RANGE_PREFIX}p.f{f}", base + 5, 90, annotation=True),
            host("cudaStreamIsCapturing", base + 2, 1, correlation=c + 5),
            host("cudaLaunchKernel", base + 10, 5, correlation=c),
            host("cudaLaunchKernel", base + 20, 5, correlation=c + 1),
            host("cuLaunchKernelEx", base + 21, 3, correlation=c + 1),
            host("cudaEventRecord", base + 30, 1, correlation=c + 6),
            cls(GPU, "gemm", base + 40, 20 + f, correlation=c),
            cls(GPU, "act", base + 70, 3, correlation=c + 1),
            cls(HOST, "aten::mm", base + 9, 20),  # an operator: never read on CUDA
        ]
    return events


def full_window(events: list[FakeEvent]) -> ProfiledWindow:
    """What the reader kept before: every runtime/driver call of the window."""
    window = read_cuda_window(events)
    window.launches = [
        HostCall(e.label, e.thread, e.start, e.start + e.duration, e.correlation)
        for e in events
        if e.device == HOST and e.label.startswith("cu")
    ]
    return window


@pytest.mark.parametrize("cls", [FakeEvent, KindedEvent])
def test_the_lean_window_attributes_exactly_like_the_full_one(cls: type[FakeEvent]) -> None:
    """R15: per-forward sums, counts and conservation unchanged; only unconsulted calls go."""
    events = forward_events(cls)
    lean = read_cuda_window(events)
    assert sorted(r.name for r in lean.ranges) == ["p.f0", "p.f1"]
    assert sorted(a.name for a in lean.activities) == ["act", "act", "gemm", "gemm", "warm"]
    assert not lean.operators
    # Event records and capture queries launch nothing: they are not kept.
    assert {c.name for c in lean.launches} == {"cudaLaunchKernel", "cuLaunchKernelEx"}
    assert len(lean.launches) == 7
    assert attribute_launches(lean) == attribute_launches(full_window(events))
    result = attribute_launches(lean)
    assert result.per_range_ns == {"p.f0": 23, "p.f1": 24}
    assert result.per_range_count == {"p.f0": 2, "p.f1": 2}
    assert result.unattributed_ns == 5 and result.total_ns == 52


def test_the_device_type_is_formatted_once_per_value() -> None:
    """Whether a device type is the host is decided per value, not per event."""

    class Device:
        formatted = 0

        def __init__(self, text: str) -> None:
            self.text = text

        def __hash__(self) -> int:
            return hash(self.text)

        def __eq__(self, other: object) -> bool:
            return isinstance(other, Device) and other.text == self.text

        def __str__(self) -> str:
            Device.formatted += 1
            return self.text

    events = forward_events()
    plain = read_cuda_window(events)
    for event in events:
        event.device = Device(event.device)  # type: ignore[assignment]
    assert read_cuda_window(events) == plain
    assert Device.formatted == 2  # host and device, once each, for 22 events


def test_ownership_failures_still_surface_through_the_lean_reader() -> None:
    """A runtime and driver call of one correlation in different ranges is still refused."""
    events = forward_events()
    driver = next(e for e in events if e.label == "cuLaunchKernelEx" and e.start < 300)
    driver.start = 321  # moved into the second forward's range
    with pytest.raises(AttributionError, match="claimed by launch calls in different ranges"):
        attribute_launches(read_cuda_window(events))
