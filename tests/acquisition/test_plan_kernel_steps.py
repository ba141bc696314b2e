"""The kernel-step plan rule (issue 20): points where vLLM's Triton expert kernel changes its
configuration, from configuration only (R10), recorded in the plan and its hash (R13, resume)."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

from acquisition.cli import build_parser, prepare
from acquisition.options import OptionError
from acquisition.plan import CaptureSizes, CudagraphMode, PointPlan, build_plan
from acquisition.plan.kernel import (
    KERNEL_STEPS_RULE,
    KERNEL_STEPS_RULE_V4,
    KernelSteps,
    KernelStepsError,
    TritonConfig,
    default_config,
    tuned_config,
)
from acquisition.protocol.samples import CheckpointError, SampleLog
from moetables.bundle import open_bundle
from moetables.geometry import ExpertGeometry, MoeTarget
from moetables.tiles import balanced_counts, block_size_m, row_tiles

REPO = Path(__file__).resolve().parents[2]
POWERS = CaptureSizes((1, 2, 4, 8, 16, 32, 64, 128, 256), "target_option")
QWEN = "Qwen/Qwen3-30B-A3B-Instruct-2507"
VLLM_CONFIGS = Path("/work/vllm-src/vllm/model_executor/layers/fused_moe/configs")


def steps_for(dp: int, rank: int = 0, assignment_steps: int = 3) -> KernelSteps:
    geometry = ExpertGeometry.for_target(128, 8, MoeTarget(1, dp, dp, rank, False))
    return KernelSteps.for_target(
        hardware="H200",
        dtype="bfloat16",
        local_experts=geometry.local_experts,
        global_experts=128,
        top_k=8,
        width=768,
        assignment_steps=assignment_steps,
    )


def f2_plan(dp: int, rank: int = 0, kernel: KernelSteps | None = None) -> PointPlan:
    """The plan of the shipped factor-2 bundles (docs/h200-runs.md), with or without the rule."""
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


# -- the configuration: vLLM 0.26.0's choice, as the tile model reads it -----------------------


@pytest.mark.parametrize("local", [128, 64, 32, 16])
def test_block_size_m_agrees_with_the_tile_model_at_every_row_count(local: int) -> None:
    steps = steps_for({128: 1, 64: 2, 32: 4, 16: 8}[local])
    for rows in range(1, 8193):
        assert steps.config(rows).block_m == block_size_m(rows, local, 768), rows


def test_the_tuned_file_resolves_ties_to_the_smaller_key() -> None:
    # Keys 128 and 256: 192 is as near to both, vLLM's min() keeps the first (smaller) key.
    assert tuned_config(192, 128, 768) == tuned_config(128, 128, 768)
    assert tuned_config(193, 128, 768) == tuned_config(256, 128, 768)
    assert tuned_config(3, 128, 768) == tuned_config(2, 128, 768)
    assert tuned_config(100, 64, 768) is None  # no tuned H200 file for 64 experts


def test_default_config_follows_get_default_config_thresholds() -> None:
    assert default_config(32, 64) == TritonConfig(16, 64, 128, 1, 4, 4)
    assert default_config(33, 64) == TritonConfig(32, 64, 128, 1, 4, 3)
    assert default_config(65, 64) == TritonConfig(32, 128, 64, 1, 4, 3)
    assert default_config(129, 64) == TritonConfig(64, 128, 64, 1, 8, 3)
    assert default_config(513, 64) == TritonConfig(128, 128, 64, 1, 8, 3)
    # GROUP_SIZE_M 16 once a local expert averages more than 128 rows.
    assert default_config(4128, 32).group_m == 16
    assert default_config(4127, 32).group_m == 1


@pytest.mark.skipif(not VLLM_CONFIGS.is_dir(), reason="vLLM 0.26.0 source not unpacked here")
def test_the_embedded_tuned_file_equals_vllms() -> None:
    raw = json.loads((VLLM_CONFIGS / "E=128,N=768,device_name=NVIDIA_H200.json").read_text())
    for key, c in raw.items():
        expected = TritonConfig(
            c["BLOCK_SIZE_M"],
            c["BLOCK_SIZE_N"],
            c["BLOCK_SIZE_K"],
            c["GROUP_SIZE_M"],
            c["num_warps"],
            c["num_stages"],
        )
        assert tuned_config(int(key), 128, 768) == expected, key
    for local in (64, 32, 16):
        assert not (VLLM_CONFIGS / f"E={local},N=768,device_name=NVIDIA_H200.json").exists()


# -- the rows: both sides of every switch --------------------------------------------------------


def test_it_brackets_every_switch_of_the_tuned_kernel_at_ep1() -> None:
    rows = steps_for(1).row_steps(2048)
    # BLOCK_SIZE_M 16 -> 32 -> 64 -> 128 and the naive assignment's end (4 x 8 x 4 = 128).
    for pair in ((192, 193), (384, 385), (768, 769), (4, 5)):
        assert set(pair) <= set(rows)
    # Keys 96 and 128, 1536 and 2048 share one configuration: no switch between them.
    assert not {112, 113, 1792, 1793} & set(rows)


def test_it_brackets_the_default_kernels_switches_with_an_expert_map() -> None:
    assert steps_for(2).row_steps(4096) == [32, 33, 64, 65, 96, 97, 128, 129, 512, 513]
    assert not steps_for(2).naive(1)  # an expert map: the sort always runs


@pytest.mark.parametrize(("dp", "rank"), [(1, 0), (2, 0), (2, 1), (4, 3), (8, 0)])
def test_no_interpolation_in_rows_spans_two_kernels(dp: int, rank: int) -> None:
    """Every row count lies between two planned rows that run its own kernel."""
    steps = steps_for(dp, rank)
    plan = f2_plan(dp, rank, steps)
    rows = sorted({p.tokens for p in plan.points if p.is_expert})
    for n in range(1, rows[-1] + 1):
        below = max(r for r in rows if r <= n)
        above = min(r for r in rows if r >= n)
        assert steps.kernel(below) == steps.kernel(n) == steps.kernel(above), n


def test_without_the_rule_a_shipped_plan_hashes_as_it_did() -> None:
    """Checkpoints and contracts of plans without the rule keep their identity."""
    bundle = open_bundle(
        REPO / "bundles/H200-vllm-modular-f2/Qwen/Qwen3-30B-A3B-Instruct-2507/bf16"
    )
    shipped = {e.target.deployment: e.contract["expert_sampling"] for e in bundle.entries}
    for dp, rank in ((1, 0), (2, 0), (2, 1)):
        plan = f2_plan(dp, rank)
        sampling = shipped[plan.target.deployment]
        assert plan.sha256 == sampling["point_plan_sha256"]
        assert len(plan.points) == sampling["points"]


def test_the_rule_is_part_of_the_plan_and_only_adds_points() -> None:
    base, steps = f2_plan(1), steps_for(1)
    plan = f2_plan(1, 0, steps)
    assert plan.sha256 != base.sha256
    assert plan.inputs()["kernel_steps"]["rule"] == KERNEL_STEPS_RULE
    assert set(base.points) < set(plan.points)
    record = plan.kernel_record()
    assert record is not None and base.kernel_record() is None
    assert record["config_source"] == "E=128,N=768,device_name=NVIDIA_H200.json"
    assert record["expert_points_added"] == len(plan.points) - len(base.points)
    assert set(record["expert_rows_added"]) == {p.tokens for p in plan.points} - {
        p.tokens for p in base.points
    }
    # Local components keep their own axis: the rule is about the expert kernel.
    assert plan.count("gate_routing") == base.count("gate_routing")
    assert all(plan.geometry.feasible(p.tokens, p.activated_experts, p.local_assignments)
               for p in plan.points if p.is_expert)  # fmt: skip


# -- the assignments: the block-padding corners in M ---------------------------------------------


def test_the_corners_make_the_row_tiles_linear_between_planned_assignments() -> None:
    """Up to the last corner, the balanced stimulus' row tiles are exactly linear between
    neighbouring planned M at every (N, A): nothing between two points steps."""
    steps = steps_for(2)
    plan = f2_plan(2, 0, steps)
    checked = 0
    pairs = sorted({(p.tokens, p.activated_experts) for p in plan.points if p.is_expert})
    for n, a in pairs:
        if a == 0:
            continue
        b = steps.config(n).block_m
        last = a * b * steps.assignment_steps + a
        ms = sorted(
            p.local_assignments
            for p in plan.points
            if p.is_expert and (p.tokens, p.activated_experts) == (n, a)
        )
        for lo, hi in itertools.pairwise(ms):
            if hi > last or lo < a * b:
                continue
            t_lo, t_hi = (row_tiles(balanced_counts(m, a), b) for m in (lo, hi))
            for m in range(lo + 1, hi):
                exact = row_tiles(balanced_counts(m, a), b)
                assert exact * (hi - lo) == t_lo * (hi - m) + t_hi * (m - lo), (n, a, m)
                checked += 1
    assert checked > 1000


def test_at_ep1_the_row_tiles_are_linear_between_planned_rows_of_one_kernel() -> None:
    """EP1 has M = N k: the padding corners are rows, planned for every A and every step."""
    steps = steps_for(1)
    plan = f2_plan(1, 0, steps)
    checked = 0
    for a in sorted({p.activated_experts for p in plan.points if p.is_expert}):
        rows = sorted(p.tokens for p in plan.points if p.is_expert and p.activated_experts == a)
        for lo, hi in itertools.pairwise(rows):
            if steps.kernel(lo) != steps.kernel(hi) or steps.naive(lo):
                continue  # a switch of kernel: bracketed, never interpolated across
            b = steps.config(lo).block_m
            t_lo, t_hi = (row_tiles(balanced_counts(8 * n, a), b) for n in (lo, hi))
            for n in range(lo + 1, hi):
                exact = row_tiles(balanced_counts(8 * n, a), b)
                assert exact * (hi - lo) == t_lo * (hi - n) + t_hi * (n - lo), (a, n)
                checked += 1
    assert checked > 1000
    # The measured +11 % of one row (A = 8: 256 -> 257 pairs per expert, 64 -> 72 tiles):
    assert {256, 257} <= {p.tokens for p in plan.points}
    assert steps_for(2).row_corners(4096, [1, 8, 64]) == []  # M is its own axis there


def test_the_first_steps_of_the_measured_staircase_are_planned() -> None:
    """docs/benchmarks.md: at N = 514, A = 8, M = 2048 -> 2056 is +27 % (one tile per expert)."""
    corners = steps_for(2).assignment_corners(514, 8, 8, 514 * 8)
    assert corners == [1024, 1032, 2048, 2056, 3072, 3080]
    assert steps_for(1).assignment_corners(4, 8, 32, 32) == []  # naive: no padding


def test_the_corners_count_up_to_the_configured_steps() -> None:
    assert f2_plan(2, 0, steps_for(2, 0, 0)).count("experts") < f2_plan(
        2, 0, steps_for(2, 0, 3)
    ).count("experts")
    with pytest.raises(KernelStepsError):
        steps_for(2, 0, -1)


# -- the option: on by default for the vLLM backends, recorded, and resume keeps plans apart ----


def argv(tmp_path: Path, *extra: str) -> list[str]:
    return [
        "slice",
        QWEN,
        "--hardware",
        "H200",
        "--tp",
        "1",
        "--tp-refresh",
        "1",
        "--max-num-seqs",
        "128",
        "--cudagraph-capture-sizes",
        "1,2,4,8,16,32,64,128,256",
        "--out-root",
        str(tmp_path / "out"),
        *extra,
    ]


@pytest.mark.parametrize(
    ("extra", "on"),
    [
        ((), True),  # auto selects the vLLM adapters only
        (("--backend", "vllm-modular"), True),
        (("--backend", "vllm-live"), True),
        (("--backend", "torch-reference"), False),
        (("--backend", "vllm-modular", "--moe-kernel-steps", "off"), False),
        (("--backend", "torch-reference", "--moe-kernel-steps", "on"), True),
        (("--hardware", "RTXPRO6000"), False),  # tuned files not embedded: auto declines
    ],
)
def test_the_option_decides_the_rule(tmp_path: Path, extra: tuple[str, ...], on: bool) -> None:
    args = argv(tmp_path, *extra)
    _, plans = prepare(build_parser().parse_args(args), args)
    assert (plans[0].kernel is not None) is on
    if plans[0].kernel is not None:  # auto and on plan rule v4 (docs/acquisition.md, "Rule v4")
        assert plans[0].kernel.rule == KERNEL_STEPS_RULE_V4


def test_on_refuses_a_configuration_it_does_not_model(tmp_path: Path) -> None:
    args = argv(tmp_path, "--hardware", "RTXPRO6000", "--moe-kernel-steps", "on")
    with pytest.raises(OptionError) as caught:
        prepare(build_parser().parse_args(args), args)
    assert caught.value.field == "kernel_steps"


def test_a_checkpoint_of_another_plan_is_not_resumed(tmp_path: Path) -> None:
    """The resume identity holds the plan's hash: the old plan's samples never mix in."""
    identity = {"schema": "x", "point_plan_sha256": f2_plan(1).sha256}
    SampleLog.open(tmp_path, identity, {}).close()
    new = {**identity, "point_plan_sha256": f2_plan(1, 0, steps_for(1)).sha256}
    with pytest.raises(CheckpointError, match="point_plan_sha256"):
        SampleLog.open(tmp_path, new, {})


def test_the_contract_records_the_rule(tmp_path: Path) -> None:
    from acquisition.publish import build_contract

    conditioning = {
        "expert_weight_bytes": 1,
        "expert_bank_bytes": 1,
        "cache_bytes": 1,
        "cache_source": "declared",
        "banks": 2,
        "expert_bytes": 1,
        "control_sets": [],
    }
    for kernel_steps, present in (("auto", True), ("off", False)):
        args = argv(tmp_path, "--backend", "vllm-modular", "--moe-kernel-steps", kernel_steps)
        request, plans = prepare(build_parser().parse_args(args), args)
        contract = build_contract(request, plans[0], {}, conditioning, {})
        sampling = contract["expert_sampling"]
        assert sampling["point_plan_sha256"] == plans[0].sha256
        assert ("kernel_steps" in sampling) is present
        if present:
            assert sampling["kernel_steps"] == plans[0].kernel_record()
            assert sampling["kernel_steps"]["expert_rows_added"][:3] == [3, 5, 6]
            assert sampling["kernel_steps"]["rule"] == KERNEL_STEPS_RULE_V4  # auto's rule


# -- the other shipped models: Mixtral's tuned file, block FP8 ----------------------------------


@pytest.mark.parametrize(
    ("model", "dp", "source"),
    [
        ("mistralai/Mixtral-8x7B-Instruct-v0.1", 1, "E=8,N=14336,device_name=NVIDIA_H200.json"),
        ("mistralai/Mixtral-8x7B-Instruct-v0.1", 2, "get_default_config"),
        (
            "Qwen/Qwen3-30B-A3B-Instruct-2507-FP8",
            1,
            "E=128,N=768,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128,128].json",
        ),
        ("Qwen/Qwen3-30B-A3B-Instruct-2507-FP8", 2, "get_default_config"),
        ("Qwen/Qwen1.5-MoE-A2.7B", 1, "get_default_config"),
    ],
)
def test_auto_plans_each_model_with_the_file_vllm_reads(
    tmp_path: Path, model: str, dp: int, source: str
) -> None:
    """auto is on for block FP8 too, keyed by the weights' quantization, not the activations'
    bf16; the record names the config file (or the default) the rule bracketed."""
    args = argv(tmp_path, "--backend", "vllm-modular")
    args[1] = model
    if dp > 1:
        args += ["--dp", str(dp), "--ranks", "0"]
    _, plans = prepare(build_parser().parse_args(args), args)
    record = plans[0].kernel_record()
    assert record is not None
    assert record["config_source"] == source
    if "FP8" in model:
        assert (record["config_dtype"], record["block_shape"]) == ("fp8_w8a8", [128, 128])
    else:
        assert record["config_dtype"] is None


def test_mixtral_dp1_brackets_its_tuned_switches_not_the_defaults() -> None:
    steps = KernelSteps.for_target(
        hardware="H200", dtype="bfloat16", local_experts=8, global_experts=8, top_k=2, width=14336
    )
    rows = set(steps.row_steps(2048))
    # Keys 1, 2, 4 of E=8,N=14336 differ (BLOCK_SIZE_M 16, 32, 16): switches at 1|2 and 3|4.
    assert {1, 2, 3, 4} <= rows
    # The default config's first BLOCK_SIZE_M switch (32 | 33) is not one of this file's.
    assert steps.config(32) == steps.config(33) or {32, 33} <= rows


def test_block_fp8_rows_bracket_the_fp8_files_switch() -> None:
    fp8 = KernelSteps.for_target(
        hardware="H200",
        dtype="bfloat16",
        local_experts=128,
        global_experts=128,
        top_k=8,
        width=768,
        quantization="fp8",
        weight_block=(128, 128),
    )
    bf16 = steps_for(1)
    assert {192, 193} <= set(fp8.row_steps(2048))
    assert (fp8.config(193).block_m, bf16.config(193).block_m) == (64, 32)
    with pytest.raises(KernelStepsError, match="quantization"):
        KernelSteps.for_target(
            hardware="H200",
            dtype="bfloat16",
            local_experts=8,
            global_experts=8,
            top_k=2,
            width=14336,
            quantization="fp8",
        )
