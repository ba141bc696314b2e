"""Rule v3 of the kernel-step plan (issue 20 item 1): v2 plus both edges of every block-padding
ramp, from configuration only (R10); opt-in (``--moe-kernel-steps v3``), v2 unchanged (R13: the
shipped kernel-step plans keep their hashes)."""

from __future__ import annotations

from pathlib import Path

import pytest

from acquisition.cli import build_parser, prepare
from acquisition.options import OptionError
from acquisition.plan import CaptureSizes, CudagraphMode, PointPlan, build_plan
from acquisition.plan.kernel import (
    KERNEL_STEPS_RULE,
    KERNEL_STEPS_RULE_V3,
    KERNEL_STEPS_RULE_V4,
    KernelSteps,
    KernelStepsError,
)
from bench.loo_surfaces import kernel_steps
from moetables.bundle import open_bundle
from moetables.geometry import ExpertGeometry, MoeTarget

REPO = Path(__file__).resolve().parents[2]
POWERS = CaptureSizes((1, 2, 4, 8, 16, 32, 64, 128, 256), "target_option")
QWEN = "Qwen/Qwen3-30B-A3B-Instruct-2507"
F2K = {
    kind: REPO / f"bundles/H200-vllm-{kind}-f2k/Qwen/Qwen3-30B-A3B-Instruct-2507/bf16"
    for kind in ("modular", "live")
}


def steps(dp: int, rank: int = 0, rule: str = KERNEL_STEPS_RULE) -> KernelSteps:
    geometry = ExpertGeometry.for_target(128, 8, MoeTarget(1, dp, dp, rank, False))
    return KernelSteps.for_target(
        hardware="H200",
        dtype="bfloat16",
        local_experts=geometry.local_experts,
        global_experts=128,
        top_k=8,
        width=768,
        rule=rule,
    )


def f2_plan(dp: int, rank: int, kernel: KernelSteps) -> PointPlan:
    target = MoeTarget(1, dp, dp, rank, False)
    components = ("gate_routing", "experts") + (("finalize_copy",) if dp > 1 else ())
    return build_plan(
        target,
        ExpertGeometry.for_target(128, 8, target),
        components,
        max_num_batched_tokens=2048,
        max_num_seqs=128,
        factor=2.0,
        mode=CudagraphMode.FULL_AND_PIECEWISE,
        captures=POWERS,
        kernel=kernel,
    )


@pytest.mark.parametrize("kind", ["modular", "live"])
def test_the_shipped_f2k_plans_still_hash_as_their_contracts(kind: str) -> None:
    """R13: v2 (`KernelSteps.for_target`'s default, ``--moe-kernel-steps v2``, and the rule bench
    reads from the contract) reproduces every
    shipped kernel-step plan's hash and point count; v3 of the same target does not."""
    bundle = open_bundle(F2K[kind])
    for entry in bundle.entries:
        sampling = entry.contract["expert_sampling"]
        assert sampling["kernel_steps"]["rule"] == KERNEL_STEPS_RULE
        t = entry.target
        plan = f2_plan(t.dp, t.rank, steps(t.dp, t.rank))
        assert plan.sha256 == sampling["point_plan_sha256"]
        assert len(plan.points) == sampling["points"]
        assert kernel_steps(entry).rule == KERNEL_STEPS_RULE
        v3 = f2_plan(t.dp, t.rank, steps(t.dp, t.rank, KERNEL_STEPS_RULE_V3))
        assert v3.sha256 != plan.sha256


@pytest.mark.parametrize(("dp", "rank"), [(1, 0), (2, 0), (2, 1)])
def test_v3_only_adds_points_and_keeps_v2s_switches(dp: int, rank: int) -> None:
    v2, v3 = steps(dp, rank), steps(dp, rank, KERNEL_STEPS_RULE_V3)
    assert v2.switches_rule == v3.switches_rule  # the same segments: the lookup splits alike
    assert v2.row_steps(4096) == v3.row_steps(4096)
    a, b = f2_plan(dp, rank, v2), f2_plan(dp, rank, v3)
    assert set(a.points) < set(b.points)
    record = b.kernel_record()
    assert record is not None and record["rule"] == KERNEL_STEPS_RULE_V3
    assert b.inputs()["kernel_steps"]["rule"] == KERNEL_STEPS_RULE_V3


def test_v3_measures_both_edges_of_each_ramp_in_m() -> None:
    """M = A*B*j + r for r = 0, 1, A - 1, A (v2: 0 and A), B = BLOCK_SIZE_M at N."""
    v2, v3 = steps(2), steps(2, 0, KERNEL_STEPS_RULE_V3)
    n, a = 300, 16
    b = v3.config(n).block_m
    high = n * 8
    want = {a * b * j + r for j in (1, 2, 3) for r in (0, 1, a - 1, a) if a * b * j + r <= high}
    assert set(v3.assignment_corners(n, a, 1, high)) == want
    assert set(v2.assignment_corners(n, a, 1, high)) == {
        a * b * j + r for j in (1, 2, 3) for r in (0, a) if a * b * j + r <= high
    }


def test_v3_brackets_the_ep1_ramps_measured_errors_sat_in() -> None:
    """At EP1 (M = 8 N) the ramp A*B*j .. A*B*j + A spans A/8 rows: v3 adds the first row past
    the corner and the last before the ramp ends. The f2k DP1 leave-one-out errors above 5 %
    between bends sat at N = 1,025-1,026 (A = 16, 32, 64; B = 128), 258-260 (A = 32, 64; B = 32)
    and 65-68 (A = 16, 32; B = 16) (docs/benchmarks.md, "Rule v3")."""
    v2, v3 = steps(1), steps(1, 0, KERNEL_STEPS_RULE_V3)
    actives = (8, 16, 32, 64, 128)
    rows2, rows3 = set(v2.row_corners(2048, actives)), set(v3.row_corners(2048, actives))
    assert rows2 < rows3
    for corner, block, active in ((1024, 128, 64), (256, 32, 64), (64, 16, 32)):
        assert v3.config(corner + 1).block_m == block
        end = corner + active // 8
        assert {corner, corner + 1, end - 1, end} <= rows3
        assert end - 1 not in rows2 or active <= 16


def test_an_unknown_rule_is_refused() -> None:
    with pytest.raises(KernelStepsError, match="not known"):
        steps(1, 0, "vllm-0.26.0-triton-config-steps-v9")


def argv(tmp_path: Path, *extra: str) -> list[str]:
    return [
        "slice", QWEN, "--hardware", "H200", "--tp", "1", "--tp-refresh", "1", "--group", "moe",
        "--dp", "1,2",
        "--max-num-batched-tokens", "2048", "--max-num-seqs", "128", "--moe-grid-factor", "2",
        "--cudagraph-capture-sizes", "1,2,4,8,16,32,64,128,256", "--backend", "vllm-modular",
        "--out-root", str(tmp_path / "out"), *extra,
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("value", "rule", "points"),
    [
        ("auto", KERNEL_STEPS_RULE_V4, (1010, 1430, 1430)),
        ("on", KERNEL_STEPS_RULE_V4, (1010, 1430, 1430)),
        ("v2", KERNEL_STEPS_RULE, (568, 1207, 1207)),
        ("v3", KERNEL_STEPS_RULE_V3, (633, 1430, 1430)),
    ],
)
def test_the_option_picks_the_rule_and_the_dry_run_counts(
    tmp_path: Path, value: str, rule: str, points: tuple[int, ...]
) -> None:
    """auto and on plan v4 (the lead's decision on the measured v4 evidence, docs/acquisition.md
    "Rule v4"); v2 (the f2k bundles' plans) and v3 stay explicit choices with their own counts.
    The counts are what ``--dry-run`` prints for the f2k options (docs/h200-runs.md)."""
    args = argv(tmp_path, "--moe-kernel-steps", value)
    _, plans = prepare(build_parser().parse_args(args), args)
    assert [p.kernel.rule for p in plans if p.kernel is not None] == [rule] * 3
    assert tuple(len(p.points) for p in plans) == points


def test_v3_refuses_a_configuration_it_does_not_model(tmp_path: Path) -> None:
    args = argv(tmp_path, "--hardware", "RTXPRO6000", "--moe-kernel-steps", "v3")
    with pytest.raises(OptionError) as caught:
        prepare(build_parser().parse_args(args), args)
    assert caught.value.field == "kernel_steps"


def test_the_loo_classes_count_v3s_ramp_edges_as_bends_and_v2_as_before() -> None:
    """bench's `is_knot`: a v3 table's ramp edges are bends (removed, they are answered over a
    step); a v2 table's classes do not change (the published v2 LOO stays reproducible)."""
    from bench.loo_surfaces import PointError, is_knot

    v2, v3 = steps(1), steps(1, 0, KERNEL_STEPS_RULE_V3)

    def knot(n: int, a: int, rule: KernelSteps) -> bool:
        return is_knot(PointError(n, a, 8 * n, 1.0, 1.0), rule)

    # A = 32, B = 128 at EP1: the ramp 1,024..1,028; v3's edges 1,025 and 1,027.
    assert v3.config(1025).block_m == 128
    assert [knot(n, 32, v3) for n in (1025, 1026, 1027)] == [True, False, True]
    assert [knot(n, 32, v2) for n in (1025, 1026, 1027)] == [False, False, False]
    # Inside a flat stretch neither rule sees a bend.
    assert not knot(1100, 32, v3) and not knot(1100, 32, v2)


def test_the_dry_run_names_the_rule_auto_plans(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--dry-run`` at the f2k options names the rule beside the sizes, so that the default
    (v4 since session 6) and an explicit v2 (the f2k tables' plan) are told apart."""
    from acquisition.cli import main

    assert main([*argv(tmp_path), "--dry-run", "--no-progress-bar"], whole_process=False) == 0
    auto = capsys.readouterr()
    assert (
        main([*argv(tmp_path, "--moe-kernel-steps", "v2"), "--dry-run", "--no-progress-bar"]) == 0
    )
    v2 = capsys.readouterr()
    text_auto, text_v2 = auto.out + auto.err, v2.out + v2.err
    assert "dp1_ep1_rank0_sp0: 1010 points" in text_auto
    assert "kernel steps v4: +942 expert points" in text_auto
    assert "dp2_ep2_rank1_sp0: 1430 points" in text_auto and "kernel steps v2" not in text_auto
    assert "dp1_ep1_rank0_sp0: 568 points" in text_v2
    assert "kernel steps v2: +500 expert points" in text_v2
    assert "dp2_ep2_rank1_sp0: 1207 points" in text_v2 and "kernel steps v4" not in text_v2
