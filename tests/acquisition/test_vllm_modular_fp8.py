"""Block-FP8 experts through ``vllm-modular`` on CPU (issue 20, item 4; R21-R24, R32, R33).

The FP8 fakes (``vllm_fp8_fakes``) mirror vLLM 0.26.0's FP8 oracle, quant config and activation
quantization; the experts dequantize with the scales of their own quant config, so a bank whose
experts read another bank's scales would give another output.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import vllm_fakes as fv
import vllm_fp8_fakes as f8
from tiny_moe import write_model

from acquisition.adapters.vllm_capabilities import CapabilityError
from acquisition.adapters.vllm_fp8 import env_removals
from acquisition.adapters.vllm_modular_backend import VllmModularBackend
from acquisition.catalog import MoeModel, resolve_model, variant_for_dtype
from acquisition.cli import build_parser
from acquisition.options import from_namespace, prepare
from acquisition.protocol.stimulus import routing_stimulus
from moetables.comm import CollectiveStep, TensorWidths, build_trace
from moetables.geometry import ExpertGeometry, MoeTarget, linear_expert_map

DP1 = MoeTarget(tp=1, dp=1, ep=1, rank=0, sequence_parallel=False)
DP2_RANK0 = MoeTarget(tp=1, dp=2, ep=2, rank=0, sequence_parallel=False)
DP2_RANK1 = MoeTarget(tp=1, dp=2, ep=2, rank=1, sequence_parallel=False)
FP8_MODEL = "Qwen/Qwen3-30B-A3B-Instruct-2507-FP8"
QUANT = {
    "quant_method": "fp8",
    "fmt": "e4m3",
    "weight_block_size": [128, 128],
    "activation_scheme": "dynamic",
}


@pytest.fixture
def model(tmp_path: Path) -> MoeModel:
    # The smallest geometry whose widths are whole 128 x 128 blocks.
    folder = write_model(
        tmp_path / "tiny-fp8",
        hidden_size=256,
        moe_intermediate_size=128,
        num_experts=8,
        num_experts_per_tok=2,
        quantization_config=QUANT,
    )
    return resolve_model(str(folder))


@pytest.fixture(autouse=True)
def quantizing_prepare(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(fv.PREPARE_CLASSES, "no_dp_ep", f8.Fp8NoDPEP)


def backend(**overrides: Any) -> VllmModularBackend:
    return VllmModularBackend(
        resolve=fv.resolver(f8.fp8_namespace(**overrides)), activities=fv.activities
    )


def stimulus(model: MoeModel, target: MoeTarget, n: int, a: int, m: int) -> Any:
    geometry = ExpertGeometry.for_target(model.global_experts, model.top_k, target)
    mapping = linear_expert_map(model.global_experts, target.ep, target.rank)
    return routing_stimulus(geometry, mapping, n, a, m, seed=n)


# -- the catalog entry -------------------------------------------------------------------------


def test_the_catalog_holds_the_block_fp8_checkpoint_with_its_quantization() -> None:
    fp8 = resolve_model(FP8_MODEL)
    bf16 = resolve_model("Qwen/Qwen3-30B-A3B-Instruct-2507")
    assert fp8.block_fp8 and not bf16.block_fp8
    assert (fp8.quantization, fp8.weight_block_size) == ("fp8", (128, 128))
    assert (fp8.quant_format, fp8.activation_scheme) == ("e4m3", "dynamic")
    # Same MoE geometry as the bf16 checkpoint; activations stay bfloat16.
    for field in ("hidden_size", "expert_intermediate_size", "global_experts", "top_k"):
        assert getattr(fp8, field) == getattr(bf16, field)
    assert fp8.dtype == "bfloat16"
    assert fp8.source_url is not None and fp8.source_url.endswith(
        "Qwen3-30B-A3B-Instruct-2507-FP8/blob/main/config.json"
    )
    assert fp8.geometry["weight_block_size"] == [128, 128]


def test_an_fp8_checkpoint_gets_its_own_bundle_variant(tmp_path: Path) -> None:
    assert variant_for_dtype("bfloat16", "fp8") == "fp8"
    assert variant_for_dtype("bfloat16") == "bf16"
    argv = ["slice", FP8_MODEL, "--hardware", "H200", "--out-root", str(tmp_path)]
    argv += ["--tp", "1", "--tp-refresh", "1", "--dp", "1,2"]
    request, plans = prepare(from_namespace(build_parser().parse_args(argv)))
    assert request.variant == "fp8" and request.dtype == "bfloat16"
    assert [p.target.dp for p in plans] == [1, 2, 2]


# -- admission and the oracle ----------------------------------------------------------------


def test_it_admits_block_fp8_and_plans_the_dispatch_quantization_for_dp_ep(
    model: MoeModel,
) -> None:
    b = backend()
    for target in (DP1, DP2_RANK0, DP2_RANK1):
        assert b.admit(model, target, fv.fake_runtime("cuda", True)).admitted
    assert b.components(model, DP1) == ("gate_routing", "experts")
    assert b.components(model, DP2_RANK1) == (
        "gate_routing",
        "dispatch_quant",
        "experts",
        "finalize_copy",
    )


@pytest.mark.parametrize(
    ("quant", "expected"),
    [
        ({"quant_method": "fp8", "activation_scheme": "static"}, "per-tensor FP8"),
        ({**QUANT, "weight_block_size": [64, 64]}, "vLLM's block FP8 keys are [128, 128]"),
        ({**QUANT, "activation_scheme": "static"}, "activation_scheme 'static'"),
        ({"quant_method": "awq"}, "quantized checkpoint (awq)"),
    ],
)
def test_it_declines_fp8_it_does_not_emulate(
    tmp_path: Path, quant: dict[str, Any], expected: str
) -> None:
    folder = write_model(
        tmp_path / "other", hidden_size=256, moe_intermediate_size=128, quantization_config=quant
    )
    admission = backend().admit(resolve_model(str(folder)), DP1, fv.fake_runtime("cuda", True))
    assert not admission.admitted
    assert any(expected in r for r in admission.reasons), admission.reasons


def test_it_asks_vllms_fp8_oracle_as_fp8_moe_method_does_and_records_the_declines(
    model: MoeModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("VLLM_USE_DEEP_GEMM", "VLLM_MOE_USE_DEEP_GEMM"):
        monkeypatch.delenv(name, raising=False)
    f8.CALLS.clear()
    session = backend().build(model, DP2_RANK1, fv.fake_runtime(), "bfloat16")
    try:
        assert f8.CALLS == [{"weight_key": "kFp8Static128BlockSym", "allow_vllm_cutlass": False}]
        oracle = session.describe()["quantization"]["oracle"]
        assert oracle["selected"] == "TRITON"
        assert oracle["experts_class"].endswith("Fp8TritonExperts")
        declined = {d["backend"]: d["reason"] for d in oracle["declined_before_selection"]}
        # EP on Hopper puts FlashInfer CUTLASS first: not installed in the kit.
        assert list(declined) == ["FLASHINFER_CUTLASS", "DEEPGEMM", "VLLM_CUTLASS"]
        assert "No module named 'flashinfer'" in declined["FLASHINFER_CUTLASS"]
        assert "DeepGEMM is not available" in declined["DEEPGEMM"]
        assert "allow_vllm_cutlass=False" in declined["VLLM_CUTLASS"]
    finally:
        session.close()


def test_a_backend_the_environment_removed_is_recorded_with_the_switch_not_a_device_reason(
    model: MoeModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The H200 FP8 run (2026-12-01, docs/h200-runs.md) set VLLM_USE_DEEP_GEMM=0 because the
    kit lacks DeepGEMM's JIT headers: vLLM's oracle then removes DEEPGEMM before its walk, and
    is_supported_config would answer "kernel does not support current device", which is false
    on an H200. The contract must name the switch and record the environment it ran under."""
    monkeypatch.setenv("VLLM_USE_DEEP_GEMM", "0")
    monkeypatch.delenv("VLLM_MOE_USE_DEEP_GEMM", raising=False)
    session = backend().build(model, DP2_RANK1, fv.fake_runtime(), "bfloat16")
    try:
        oracle = session.describe()["quantization"]["oracle"]
        declined = {d["backend"]: d["reason"] for d in oracle["declined_before_selection"]}
        assert declined["DEEPGEMM"] == "removed by the environment: VLLM_USE_DEEP_GEMM=0"
        assert oracle["environment"] == {"VLLM_USE_DEEP_GEMM": "0"}
        assert "No module named 'flashinfer'" in declined["FLASHINFER_CUTLASS"]
    finally:
        session.close()


@pytest.mark.parametrize(
    ("environ", "removed"),
    [
        ({}, {}),
        ({"VLLM_USE_DEEP_GEMM": "1"}, {}),
        ({"VLLM_MOE_USE_DEEP_GEMM": "0"}, {"DEEPGEMM", "BATCHED_DEEPGEMM"}),
        (
            {"VLLM_USE_DEEP_GEMM": "1", "VLLM_MOE_USE_DEEP_GEMM": "0"},
            {"DEEPGEMM", "BATCHED_DEEPGEMM"},
        ),
        ({"VLLM_ROCM_USE_AITER": "1", "VLLM_ROCM_USE_AITER_MOE": "0"}, {"AITER"}),
        ({"VLLM_ROCM_USE_AITER": "true", "VLLM_ROCM_USE_AITER_MOE": "1"}, set()),
    ],
)
def test_environment_removals_follow_vllms_oracle(
    environ: dict[str, str], removed: set[str]
) -> None:
    """vLLM 0.26.0 oracle/fp8.py: a switch pair that is set with either member false removes
    its backends; unset pairs remove nothing (the DeepGEMM pair defaults to on)."""
    assert set(env_removals(environ)) == set(removed)


def test_no_fp8_backend_is_a_refusal_with_vllms_reason(model: MoeModel) -> None:
    def nothing(*args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError("No FP8 MoE backend supports the deployment configuration.")

    b = backend(**{f"{f8.FM}.oracle.fp8:select_fp8_moe_backend": nothing})
    admission = b.admit(model, DP1, fv.fake_runtime("cuda", True))
    assert any("selects no FP8 MoE backend" in r for r in admission.reasons)


# -- DP1: the quantizing prepare inside experts ------------------------------------------------


def test_dp1_records_fp8_dtypes_scales_and_the_quantizing_prepare(model: MoeModel) -> None:
    session = backend().build(model, DP1, fv.fake_runtime(), "bfloat16")
    try:
        described = session.describe()
        dtypes = described["dtypes"]
        assert dtypes["expert_weights"] == "float8_e4m3fn"
        assert dtypes["weight_scales"] == "float32"
        assert dtypes["expert_activations"] == "float8_e4m3fn"
        assert dtypes["hidden_states"] == "bfloat16"
        quant = described["quantization"]
        assert quant["weight_block_shape"] == [128, 128]
        assert "per token and 128-column group" in quant["activation_quantization"]
        layout = described["expert_layout"]
        assert layout["w13_scale"]["shape"] == [8, 2, 2]  # [E, 2I/128, H/128]
        assert layout["w2_scale"]["shape"] == [8, 2, 1]  # [E, H/128, I/128]
        prepare = described["local_execution"]["prepare"]
        assert "quantizes the input to float8_e4m3fn [32, 256]" in prepare
        assert "scales [32, 2]" in prepare and "1 device activities" in prepare
        assert described["experts_activities_per_forward"] == {
            "per_token_group_fp8_quant": 1,
            "fused_moe_kernel_fp8": 1,
        }
        assert "dynamic FP8 quantization" in described["boundaries"]["experts"]
    finally:
        session.close()


def test_a_dp1_prepare_that_does_not_quantize_is_refused(
    model: MoeModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(fv.PREPARE_CLASSES, "no_dp_ep", fv.NoDPEP)
    with pytest.raises(CapabilityError, match="not 8-bit activations"):
        backend().build(model, DP1, fv.fake_runtime(), "bfloat16")


def test_banks_own_fp8_weights_and_scales_and_their_own_experts(model: MoeModel) -> None:
    session = backend().build(model, DP1, fv.fake_runtime(), "bfloat16")
    try:
        weights = session.w13.numel() + session.w2.numel()  # one byte each
        scales = 4 * (session.w13_scale.numel() + session.w2_scale.numel())
        assert session.expert_weight_bytes() == weights + scales
        assert session.expert_bank_bytes() == weights + scales
        session.allocate_banks(3)
        assert len(session.banks) == len(session.bank_experts) == 3
        for bank, experts in zip(session.banks, session.bank_experts, strict=True):
            assert bank[0].dtype == torch.float8_e4m3fn
            assert experts.quant_config.w1_scale is bank[2]
            assert experts.quant_config.w2_scale is bank[3]
            assert bank[2].data_ptr() != session.w13_scale.data_ptr()
        prepared = session.prepare_experts(stimulus(model, DP1, 5, 3, 10))
        reference = session.reference_experts(prepared).clone()
        for index in range(3):
            out = session.run_experts(prepared, index)
            assert out is prepared.output
            assert torch.equal(out, reference)
        # A bank's experts read the bank's scales: doubling them doubles that bank's output.
        session.banks[1][2].mul_(2)
        doubled = session.run_experts(prepared, 1)
        assert not torch.equal(doubled, reference)
    finally:
        session.close()


# -- DP+EP: the dispatch quantization on local rows --------------------------------------------


def test_dp_ep_quantizes_local_rows_before_the_gather(model: MoeModel) -> None:
    session = backend().build(model, DP2_RANK0, fv.fake_runtime(), "bfloat16")
    try:
        assert session.components == ("gate_routing", "dispatch_quant", "experts", "finalize_copy")
        quant = session.local_forward("dispatch_quant", 6)
        values, scale = quant.run()
        assert values.dtype == torch.uint8 and values.shape == (6, 256)
        assert scale.shape == (6, 2)
        assert all(torch.equal(a, b) for a, b in zip(quant.run(), quant.reference(), strict=True))
        described = session.describe()
        assert described["dtypes"]["dispatched_hidden_states"] == "float8_e4m3fn"
        assert described["dtypes"]["dispatched_scales"] == "float32"
        assert "before the all-gather" in described["boundaries"]["dispatch_quant"]
        assert "FP8 values" in described["boundaries"]["experts"]
        # The experts see the gathered FP8 rows: their activities hold no quantization.
        assert described["experts_activities_per_forward"] == {"fused_moe_kernel_fp8": 1}
        session.allocate_banks(2)
        prepared = session.prepare_experts(stimulus(model, DP2_RANK0, 6, 3, 7))
        assert prepared.dispatched.dtype == torch.float8_e4m3fn
        assert torch.equal(session.run_experts(prepared, 1), session.reference_experts(prepared))
    finally:
        session.close()


def test_the_block_trace_gathers_fp8_rows_and_their_scales() -> None:
    widths = TensorWidths(
        hidden_states=2048 * 2,
        topk_weights=8 * 4,
        topk_ids=8 * 4,
        source="test",
        dispatched_hidden_states=2048,
        dispatched_scales=16 * 4,
    )
    components = ("gate_routing", "dispatch_quant", "experts", "finalize_copy")
    trace = build_trace(1, 2, False, components, widths)
    assert trace.components == components
    steps = [s for s in trace.steps if isinstance(s, CollectiveStep)]
    gathered = {s.tensor: s.row_bytes for s in steps if s.op == "all_gather"}
    assert gathered == {
        "hidden_states": 2048,
        "activation_scales": 64,
        "topk_weights": 32,
        "topk_ids": 32,
    }
    assert {s.launch for s in steps if s.op == "all_gather"} == {"dispatch"}  # one NCCL group
    combine = [s.row_bytes for s in steps if s.op == "reduce_scatter"]
    assert combine == [4096]  # the combine moves bf16 rows


def test_the_protocol_measures_dispatch_quant_and_fp8_expert_points(model: MoeModel) -> None:
    """R14-R17 on the FP8 DP+EP rank: the local quantization verified against its reference
    (byte-exact FP8 values and scales) and timed; expert points over every bank."""
    from acquisition.plan import PlanPoint
    from acquisition.protocol.measure import PointMeter, ProtocolSettings, context_order

    session = backend().build(model, DP2_RANK1, fv.fake_runtime(), "bfloat16")
    try:
        geometry = ExpertGeometry.for_target(model.global_experts, model.top_k, DP2_RANK1)
        mapping = linear_expert_map(model.global_experts, 2, 1)
        session.allocate_banks(4)
        meter = PointMeter(
            session,
            ProtocolSettings(rounds=1, iterations=1),
            geometry,
            mapping,
            banks=2,
            device="cpu",
        )
        for point in (PlanPoint("dispatch_quant", 8), PlanPoint("experts", 4, 2, 5)):
            results, _, checked = meter.measure(point, context_order(point, 1), verify=True)
            assert checked >= 1
            assert all(t > 0 for r in results for t in r.forwards_us)
    finally:
        session.close()


# -- resume identity: one oracle setting per checkpoint --------------------------------------


def _identity_of(model: MoeModel) -> dict[str, Any]:
    from types import SimpleNamespace

    from acquisition.acquire import _identity

    request = SimpleNamespace(
        model=model,
        hardware="H200",
        dtype="bfloat16",
        device="cuda",
        settings=SimpleNamespace(identity=lambda: {"rounds": 3}),
    )
    plan = SimpleNamespace(target=DP1, sha256="plan")
    return _identity(
        request,  # type: ignore[arg-type]
        plan,  # type: ignore[arg-type]
        SimpleNamespace(name="vllm-modular"),  # type: ignore[arg-type]
        4,
        SimpleNamespace(cache_bytes=1),  # type: ignore[arg-type]
    )


def test_a_changed_fp8_oracle_switch_is_a_changed_resume_identity(
    model: MoeModel, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The 2026-12-01 H200 run re-published DP1 samples measured with DeepGEMM usable (E8M0
    scales, unfused quantization) from a process with VLLM_USE_DEEP_GEMM=0, whose session wrote
    a contract naming other kernels. The switch is now part of an FP8 target's resume identity,
    so the checkpoint refuses the mix (a changed condition needs another --out-root)."""
    from acquisition.protocol.samples import CheckpointError, SampleLog

    for name in ("VLLM_USE_DEEP_GEMM", "VLLM_MOE_USE_DEEP_GEMM"):
        monkeypatch.delenv(name, raising=False)
    first = _identity_of(model)
    assert first["vllm_fp8_environment"] == {}
    SampleLog.open(tmp_path, first, {}).close()
    monkeypatch.setenv("VLLM_USE_DEEP_GEMM", "0")
    second = _identity_of(model)
    assert second["vllm_fp8_environment"] == {"VLLM_USE_DEEP_GEMM": "0"}
    with pytest.raises(CheckpointError, match="changed: vllm_fp8_environment"):
        SampleLog.open(tmp_path, second, {})


def test_bf16_targets_keep_their_resume_identity(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only block-FP8 targets carry the switches: bf16 checkpoints of earlier runs resume."""
    monkeypatch.setenv("VLLM_USE_DEEP_GEMM", "0")
    bf16 = resolve_model(
        str(write_model(tmp_path / "bf16", hidden_size=256, moe_intermediate_size=128))
    )
    assert "vllm_fp8_environment" not in _identity_of(bf16)
