"""Calibrating the cluster description's alpha-beta link model from an NCCL sweep (R45, issue 11 part 3)."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from moetables.calibration import (
    OPS,
    CalibrationError,
    GroupedLaunch,
    bus_factor,
    cluster_document,
    dump_cluster,
    fit_collective,
    fit_group_op_us,
    fit_sweep,
    nccl_size,
    parse_sweep,
)
from moetables.comm import LinkParameters, load_cluster

SIZES = [4096 << i for i in range(17)]  # 4 KiB .. 256 MiB per rank


def _sweep(
    ranks: int,
    alpha: dict[str, float],
    bus: dict[str, float],
    *,
    skew: float = 0.0,
    bump: float = 0.0,
) -> dict[str, Any]:
    """A sweep whose last arriver follows alpha + factor*S/bus exactly; earlier ranks wait ``skew`` more.

    ``bump`` multiplies the mid-range (256 KiB..16 MiB per rank) like NCCL's protocol changes do.
    """
    points = []
    for op in OPS:
        for b in SIZES:
            s = nccl_size(op, ranks, b)
            t = alpha[op] + bus_factor(op, ranks) * s / (bus[op] * 1e3)
            if (256 << 10) <= b <= (16 << 20):
                t *= 1 + bump
            rows = [[t + skew * (r + 1) * (i % 2) for i in range(5)] for r in range(ranks - 1)] + [
                [t] * 5
            ]
            points.append({"op": op, "bytes_per_rank": b, "size_bytes": s, "rank_times_us": rows})
    return {
        "schema": "moe-nccl-sweep",
        "version": 1,
        "ranks": ranks,
        "points": points,
        "meta": {"gpu": "test", "measured_at": "2026-11-30T23:00:00+00:00"},
    }


ALPHA = {
    "all_gather": 4.5,
    "reduce_scatter": 4.0,
    "all_reduce": 5.5,
    "broadcast": 3.8,
    "reduce": 3.7,
}
BUS = {
    "all_gather": 265.0,
    "reduce_scatter": 254.0,
    "all_reduce": 313.0,
    "broadcast": 369.0,
    "reduce": 371.0,
}


@pytest.mark.parametrize("ranks", [2, 4])
def test_it_recovers_alpha_and_bus_bandwidth_of_an_exact_sweep_with_arrival_skew(
    ranks: int,
) -> None:
    """R45: the last arriver's kernel (the minimum over ranks) is the transfer; the fit recovers both."""
    fits = fit_sweep(parse_sweep(_sweep(ranks, ALPHA, BUS, skew=30.0)))
    assert list(fits) == list(OPS)
    for op, fit in fits.items():
        assert fit.alpha_us == pytest.approx(ALPHA[op], rel=1e-6)
        assert fit.bus_bandwidth_GBps == pytest.approx(BUS[op], rel=1e-6)
        assert fit.max_relative_error < 1e-6


def test_it_reports_the_mid_range_miss_instead_of_bending_the_line() -> None:
    """The two-ended fit keeps the ends and reports what the line misses in between."""
    fit = fit_collective(parse_sweep(_sweep(2, ALPHA, BUS, bump=0.4)).of("all_gather"))
    assert fit.alpha_us == pytest.approx(ALPHA["all_gather"], rel=1e-6)
    assert fit.bus_bandwidth_GBps == pytest.approx(BUS["all_gather"], rel=1e-6)
    assert fit.max_relative_error == pytest.approx(0.4 / 1.4, rel=1e-6)


def test_it_uses_the_nccl_tests_sizes_and_factors() -> None:
    assert nccl_size("all_gather", 4, 1024) == 4096 and nccl_size("reduce_scatter", 2, 8) == 16
    assert nccl_size("all_reduce", 4, 1024) == 1024 and nccl_size("broadcast", 2, 8) == 8
    assert bus_factor("all_gather", 4) == 0.75 and bus_factor("all_reduce", 2) == 1.0
    assert bus_factor("reduce", 8) == 1.0
    with pytest.raises(CalibrationError, match="unknown collective"):
        bus_factor("all_to_all", 2)
    with pytest.raises(CalibrationError, match="at least 2 ranks"):
        bus_factor("all_gather", 1)


def test_it_refuses_malformed_sweeps() -> None:
    good = _sweep(2, ALPHA, BUS)
    with pytest.raises(CalibrationError, match="schema"):
        parse_sweep({**good, "schema": "other"})
    bad = _sweep(2, ALPHA, BUS)
    bad["points"][0]["rank_times_us"] = [[1.0]]
    with pytest.raises(CalibrationError, match="one list per rank"):
        parse_sweep(bad)
    bad = _sweep(2, ALPHA, BUS)
    bad["points"][0]["rank_times_us"][0][0] = -1.0
    with pytest.raises(CalibrationError, match="finite and positive"):
        parse_sweep(bad)
    bad = _sweep(2, ALPHA, BUS)
    bad["points"][0]["size_bytes"] = 1
    with pytest.raises(CalibrationError, match="disagrees"):
        parse_sweep(bad)
    small_only = parse_sweep(_sweep(2, ALPHA, BUS))
    with pytest.raises(CalibrationError, match="at least 2 sizes"):
        fit_collective(small_only.of("reduce"), large_min_bytes_per_rank=1 << 40)


def test_it_writes_a_cluster_description_that_the_estimates_loader_reads(tmp_path: Any) -> None:
    """Without a table the calibrated file is moe-cluster version 1 (comm.load_cluster reads it)."""
    fits = fit_sweep(parse_sweep(_sweep(2, ALPHA, BUS)), table_min_share=None)
    prov = {
        "hardware": "2 x test GPU",
        "software": "torch",
        "command": "python3 sweep",
        "measured_at": "2026-11-30",
    }
    doc = cluster_document(
        name="t", description="d", provenance=prov, link="nvlink", fits=fits, ranks=[0, 1]
    )
    text = dump_cluster(doc)
    assert doc["version"] == 1
    assert "all_gather: {alpha_us: 4.5, bus_bandwidth_GBps: 265.0}" in text
    assert "- {link: nvlink, ranks: [0, 1]}" in text
    path = tmp_path / "c.yaml"
    path.write_text(text)
    cluster = load_cluster(path)
    assert cluster.name == "t" and cluster.ranks() == frozenset({0, 1})
    assert (
        yaml.safe_load(text)["link_classes"]["nvlink"]["collectives"]["reduce"]["alpha_us"] == 3.7
    )
    with pytest.raises(CalibrationError, match="measured_at"):
        cluster_document(
            name="t",
            description="d",
            provenance={**prov, "measured_at": ""},
            link="nvlink",
            fits=fits,
            ranks=[0, 1],
        )
    with pytest.raises(CalibrationError, match="missing broadcast"):
        cluster_document(
            name="t",
            description="d",
            provenance=prov,
            link="nvlink",
            fits={k: v for k, v in fits.items() if k != "broadcast"},
            ranks=[0, 1],
        )


def test_it_tables_the_bandwidth_where_the_line_misses_and_reports_leave_one_out_errors(
    tmp_path: Any,
) -> None:
    """R45: with NCCL-like mid-range slowness (+40 % from 256 KiB to 16 MiB per rank) the line
    misses by 40 %; the bandwidth-by-size table reproduces every tabled size, its leave-one-out
    error is reported, and the version 2 file gives the estimate's model the same times."""
    fits = fit_sweep(parse_sweep(_sweep(2, ALPHA, BUS, bump=0.4)))
    ag = fits["all_gather"]
    assert ag.max_relative_error > 0.25  # the line (residuals) misses the bump
    assert ag.bandwidth_by_size and ag.bandwidth_by_size[-1][0] == nccl_size(
        "all_gather", 2, 256 << 20
    )
    sizes = [s for s, _ in ag.bandwidth_by_size]
    assert sizes == sorted(sizes)
    point = {
        p.size_bytes: p.time_us
        for p in parse_sweep(_sweep(2, ALPHA, BUS, bump=0.4)).of("all_gather")
    }
    for size, _ in ag.bandwidth_by_size:
        assert ag.model_us(size) == pytest.approx(point[size], rel=1e-9)
    # Left out, a size inside the bump is predicted from its neighbours (also bumped): close.
    inner = [abs(m - t) / t for b, t, m in ag.loo_residuals if (512 << 10) <= b <= (8 << 20)]
    assert inner and max(inner) < 0.02
    # Edges of the bump are where leaving a size out costs most, and it is reported.
    assert max(abs(m - t) / t for _, t, m in ag.loo_residuals) > 0.1
    prov = {"hardware": "h", "software": "s", "command": "c", "measured_at": "2026-11-30"}
    doc = cluster_document(
        name="t",
        description="d",
        provenance=prov,
        link="nvlink",
        fits=fits,
        ranks=[0, 1],
        group_op_us=1.25,
    )
    assert doc["version"] == 2
    path = tmp_path / "t.yaml"
    path.write_text(dump_cluster(doc))
    cluster = load_cluster(path)
    assert cluster.link_classes["nvlink"].group_op_us == 1.25
    for op in OPS:
        params: LinkParameters = cluster.link_classes["nvlink"].collectives[op]
        for b in (8 << 10, 1 << 20, 3 << 20, 1 << 30):
            s = nccl_size(op, 2, b)
            # The file rounds the table to 0.01 GB/s: the two models agree to that.
            assert float(params.time_us(op, 2, s)) == pytest.approx(fits[op].model_us(s), rel=1e-3)


def test_it_fits_the_per_operation_cost_of_grouped_launches() -> None:
    """R45: group_op_us is the median excess of grouped kernels over the sweep's model of their
    operations, per operation beyond the first; it needs real groups and never goes negative."""
    fits = fit_sweep(parse_sweep(_sweep(2, ALPHA, BUS)))
    ag = fits["all_gather"]
    sizes = [(8192 * r, 64 * r, 64 * r) for r in (1, 16, 64, 256)]
    launches = [
        GroupedLaunch(
            "all_gather", 2, s, GroupedLaunch("all_gather", 2, s, 0.0).model_us(ag) + 2 * extra
        )
        for s, extra in zip(sizes, (1.0, 1.5, 1.2, 9.0), strict=True)
    ]
    assert fit_group_op_us(fits, launches) == pytest.approx(1.35)
    faster = [GroupedLaunch("all_gather", 2, s, 1.0) for s in sizes]
    assert fit_group_op_us(fits, faster) == 0.0
    with pytest.raises(CalibrationError, match="at least 3 grouped launches"):
        fit_group_op_us(fits, launches[:2])
    with pytest.raises(CalibrationError, match="at least 2 operations"):
        fit_group_op_us(fits, [GroupedLaunch("all_gather", 2, (8192,), 5.0)] * 3)
    with pytest.raises(CalibrationError, match="no all_gather fit over 4 ranks"):
        fit_group_op_us(fits, [GroupedLaunch("all_gather", 4, (8192, 64), 5.0)] * 3)
