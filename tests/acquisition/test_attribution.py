"""Attribution of profiled activities to component ranges, with conservation (R15, R26)."""

from __future__ import annotations

import pytest

from acquisition.protocol.attribution import (
    AttributionError,
    DeviceActivity,
    HostCall,
    ProfiledWindow,
    TimedRange,
    attribute_launches,
    attribute_operators,
)


def window(**parts: list) -> ProfiledWindow:
    return ProfiledWindow(**parts)


RANGES = [TimedRange("experts.f0", 1, 100, 200), TimedRange("experts.f1", 1, 300, 400)]


def test_each_activity_belongs_to_the_range_of_its_launch() -> None:
    # Kernels run long after their launches; ownership follows the launch, not the timeline.
    result = attribute_launches(
        window(
            ranges=RANGES,
            launches=[
                HostCall("cudaLaunchKernel", 1, 110, 120, correlation=7),
                HostCall("cuLaunchKernel", 1, 130, 140, correlation=8),
                HostCall("cudaLaunchKernel", 1, 310, 320, correlation=9),
            ],
            activities=[
                DeviceActivity("gemm", 350, 40, 7),
                DeviceActivity("silu", 395, 5, 8),
                DeviceActivity("gemm", 900, 30, 9),
            ],
        )
    )
    assert result.per_range_ns == {"experts.f0": 45, "experts.f1": 30}
    assert result.range_us("experts.f0") == 0.045
    assert (result.total_ns, result.attributed_ns, result.unattributed_ns) == (75, 75, 0)


def test_activities_launched_outside_ranges_are_unattributed_and_conserved() -> None:
    """R26: every activity of the window is counted once, owned or unattributed."""
    activities = [
        DeviceActivity("gemm", 130, 10, 1),
        DeviceActivity("copy", 270, 4, 2),  # launched between the ranges
        DeviceActivity("warmup kernel", 50, 6, 99),  # launched before the window
    ]
    result = attribute_launches(
        window(
            ranges=RANGES[:1],
            launches=[
                HostCall("cudaLaunchKernel", 1, 110, 120, correlation=1),
                HostCall("cudaMemcpyAsync", 1, 250, 260, correlation=2),
            ],
            activities=activities,
        )
    )
    assert result.per_range_ns == {"experts.f0": 10}
    assert (result.attributed_ns, result.unattributed_ns, result.unattributed_count) == (10, 10, 2)
    # The window's total is every activity given, counted from the input, not from the result.
    assert result.total_ns == sum(a.duration_ns for a in activities) == 20


def test_a_duplicated_activity_is_counted_once() -> None:
    activity = DeviceActivity("gemm", 130, 10, 1)
    result = attribute_launches(
        window(
            ranges=RANGES[:1],
            launches=[HostCall("cudaLaunchKernel", 1, 110, 120, correlation=1)],
            activities=[activity, activity],
        )
    )
    assert result.per_range_ns == {"experts.f0": 10} and result.total_ns == 10


def test_a_runtime_and_driver_call_sharing_a_correlation_must_agree() -> None:
    launches = [
        HostCall("cudaLaunchKernel", 1, 110, 130, correlation=1),
        HostCall("cuLaunchKernel", 1, 115, 125, correlation=1),
    ]
    result = attribute_launches(
        window(ranges=RANGES[:1], launches=launches, activities=[DeviceActivity("k", 140, 3, 1)])
    )
    assert result.per_range_ns == {"experts.f0": 3}
    launches.append(HostCall("cudaLaunchKernel", 1, 310, 320, correlation=1))
    with pytest.raises(AttributionError, match="different ranges"):
        attribute_launches(
            window(
                ranges=RANGES,
                launches=launches,
                activities=[DeviceActivity("k", 140, 3, 1), DeviceActivity("k", 330, 3, 2)],
            )
        )


@pytest.mark.parametrize(
    ("ranges", "launches", "message"),
    [
        (RANGES, [HostCall("cudaLaunchKernel", 1, 110, 120, correlation=1)], "own no activity"),
        ([TimedRange("a", 1, 100, 200), TimedRange("b", 1, 150, 250)], [], "overlap"),
        (RANGES[:1], [HostCall("cudaLaunchKernel", 1, 190, 210, correlation=1)], "ends after"),
    ],
)
def test_it_refuses_to_guess(ranges: list, launches: list, message: str) -> None:
    with pytest.raises(AttributionError, match=message):
        attribute_launches(
            window(ranges=ranges, launches=launches, activities=[DeviceActivity("k", 500, 5, 1)])
        )


def test_cpu_timing_sums_outermost_operators_only() -> None:
    # aten::linear holds aten::mm: counting both would double the time.
    result = attribute_operators(
        window(
            ranges=RANGES,
            operators=[
                HostCall("aten::linear", 1, 110, 150),
                HostCall("aten::mm", 1, 115, 145),
                HostCall("aten::silu", 1, 160, 170),
                HostCall("aten::mul", 1, 310, 330),
                HostCall("aten::empty", 1, 250, 260),  # between ranges: unattributed
            ],
        )
    )
    assert result.per_range_ns == {"experts.f0": 50, "experts.f1": 20}
    assert result.unattributed_ns == 10 and result.total_ns == 80


def test_cpu_operators_must_nest() -> None:
    with pytest.raises(AttributionError, match="without nesting"):
        attribute_operators(
            window(
                ranges=RANGES[:1],
                operators=[HostCall("aten::a", 1, 110, 150), HostCall("aten::b", 1, 140, 160)],
            )
        )


def test_a_real_cpu_profile_is_attributed_per_forward() -> None:
    torch = pytest.importorskip("torch")
    from acquisition.protocol.profiling import ProfilerCapture

    x = torch.randn(32, 32)
    capture = ProfilerCapture("cpu")
    with capture:
        torch.mm(x, x)  # outside every range
        for i in range(3):
            with capture.region(f"gate.f{i}"):
                torch.softmax(torch.mm(x, x), dim=-1)
    result = attribute_operators(capture.window())
    assert sorted(result.per_range_ns) == ["gate.f0", "gate.f1", "gate.f2"]
    assert all(count == 2 for count in result.per_range_count.values())  # mm and softmax
    assert result.unattributed_count >= 1
    assert result.attributed_ns + result.unattributed_ns == result.total_ns


def test_a_real_cuda_profile_is_attributed_by_launch_correlation() -> None:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device (runs on the H200 machine)")
    from acquisition.protocol.profiling import ProfilerCapture

    x = torch.randn(512, 512, device="cuda")
    torch.mm(x, x)
    torch.cuda.synchronize()
    capture = ProfilerCapture("cuda")
    with capture:
        torch.mm(x, x)  # launched outside every range
        for i in range(3):
            with capture.region(f"gate.f{i}"):
                torch.softmax(torch.mm(x, x), dim=-1)
    window = capture.window()
    assert window.launches and window.activities
    result = attribute_launches(window)
    assert sorted(result.per_range_ns) == ["gate.f0", "gate.f1", "gate.f2"]
    assert all(count >= 2 for count in result.per_range_count.values())  # gemm and softmax
    assert result.unattributed_count >= 1 and result.unattributed_ns > 0
    assert result.attributed_ns + result.unattributed_ns == result.total_ns
    # Device time only: each forward is a few microseconds of kernels, far below its
    # wall-clock range on the host.
    for r in window.ranges:
        assert result.per_range_ns[r.name] < r.end_ns - r.start_ns
