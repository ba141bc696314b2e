"""The vllm-modular adapter on CPU, with fakes shaped like vLLM's modular MoE APIs (R21-R24).

No vLLM and no GPU: ``vllm_fakes`` mirrors the classes, keyword parameters and return
tuples the adapter calls, and counts fake "launches" where the GPU host counts CUDA activities.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
import vllm_fakes as fv
from tiny_moe import write_model

from acquisition.adapters import AdmissionError, select_backend
from acquisition.adapters.vllm_banks import clone_banks
from acquisition.adapters.vllm_capabilities import CapabilityError
from acquisition.adapters.vllm_modular import NAIVE_DP_EP, NO_DP_EP
from acquisition.adapters.vllm_modular_backend import VllmModularBackend
from acquisition.catalog import MoeModel, resolve_model
from acquisition.plan import PlanPoint
from acquisition.protocol.measure import PointMeter, ProtocolSettings, context_order
from acquisition.protocol.stimulus import routing_stimulus
from moetables.geometry import ExpertGeometry, MoeTarget, linear_expert_map

DP1 = MoeTarget(tp=1, dp=1, ep=1, rank=0, sequence_parallel=False)
DP2_RANK1 = MoeTarget(tp=1, dp=2, ep=2, rank=1, sequence_parallel=False)


runtime = fv.fake_runtime


@pytest.fixture
def model(tmp_path: Path) -> MoeModel:
    return resolve_model(str(write_model(tmp_path / "tiny", num_experts=8)))


def backend(**overrides: Any) -> VllmModularBackend:
    return VllmModularBackend(
        resolve=fv.resolver(fv.modular_namespace(**overrides)), activities=fv.activities
    )


def stimulus(model: MoeModel, target: MoeTarget, n: int, a: int, m: int) -> Any:
    geometry = ExpertGeometry.for_target(model.global_experts, model.top_k, target)
    mapping = linear_expert_map(model.global_experts, target.ep, target.rank)
    return routing_stimulus(geometry, mapping, n, a, m, seed=n)


# -- admission -------------------------------------------------------------------------------


def test_it_declines_without_vllm_or_a_gpu(model: MoeModel) -> None:
    # CI has neither: the real resolver finds no vllm package.
    admission = VllmModularBackend().admit(model, DP1, runtime())
    assert not admission.admitted
    assert any("needs a CUDA device" in r for r in admission.reasons)
    assert any("vLLM is not importable" in r for r in admission.reasons)


def test_it_admits_an_unquantized_modular_target_on_a_gpu(model: MoeModel) -> None:
    for target in (DP1, DP2_RANK1):
        assert backend().admit(model, target, runtime("cuda", True)).admitted


def test_it_names_every_missing_api(model: MoeModel) -> None:
    fm = "vllm.model_executor.layers.fused_moe"
    namespace = fv.modular_namespace()
    del namespace[f"{fm}.modular_kernel:FusedMoEKernel"]
    admission = VllmModularBackend(resolve=fv.resolver(namespace)).admit(
        model, DP1, runtime("cuda", True)
    )
    assert not admission.admitted
    assert any("FusedMoEKernel does not exist" in r for r in admission.reasons)


def test_it_declines_an_experts_apply_with_another_signature(model: MoeModel) -> None:
    class OldExperts(fv.FusedMoEExpertsModular):
        def apply(self, output: Any, hidden_states: Any, w1: Any, w2: Any) -> None: ...  # type: ignore[override]

    fm = "vllm.model_executor.layers.fused_moe"
    b = backend(**{f"{fm}.modular_kernel:FusedMoEExpertsModular": OldExperts})
    admission = b.admit(model, DP1, runtime("cuda", True))
    assert any("takes no parameter(s)" in r and "workspace13" in r for r in admission.reasons)


def test_it_declines_a_kernel_class_that_defers_finalization(model: MoeModel) -> None:
    class DeferringKernel(fv.FusedMoEKernel):
        use_deferred_moe_finalize = True

    fm = "vllm.model_executor.layers.fused_moe"
    b = backend(**{f"{fm}.modular_kernel:FusedMoEKernel": DeferringKernel})
    admission = b.admit(model, DP1, runtime("cuda", True))
    assert any(r.startswith("deferred finalization") for r in admission.reasons)


@pytest.mark.parametrize(
    ("experts", "expected"),
    [
        (fv.MonolithicExperts, "not modular experts"),
        (fv.BatchedExperts, "activation layout"),
    ],
)
def test_it_declines_backends_it_cannot_replay(
    model: MoeModel, experts: type, expected: str
) -> None:
    fm = "vllm.model_executor.layers.fused_moe"
    b = backend(
        **{f"{fm}.oracle.unquantized:select_unquantized_moe_backend": lambda cfg: ("X", experts)}
    )
    admission = b.admit(model, DP1, runtime("cuda", True))
    assert not admission.admitted
    assert any(expected in r for r in admission.reasons)


def test_it_declines_another_all_to_all_backend_for_dp_ep(model: MoeModel) -> None:
    class DeepEpDefaults(fv.VllmConfig):
        def __init__(self) -> None:
            super().__init__()
            self.parallel_config.all2all_backend = "deepep_low_latency"

    b = backend(**{"vllm.config:VllmConfig": DeepEpDefaults})
    assert b.admit(model, DP1, runtime("cuda", True)).admitted  # DP1 needs no all-to-all
    admission = b.admit(model, DP2_RANK1, runtime("cuda", True))
    assert any("deepep_low_latency" in r for r in admission.reasons)


def test_it_declines_quantized_and_biased_checkpoints(model: MoeModel) -> None:
    for changed, expected in (
        (replace(model, quantization="mxfp4"), "quantized checkpoint"),
        (replace(model, quantization="fp8"), "per-tensor FP8"),
        (replace(model, expert_bias=True), "biased experts"),
    ):
        admission = backend().admit(changed, DP1, runtime("cuda", True))
        assert any(expected in r for r in admission.reasons), admission.reasons
    # A shared expert alone is no reason: the table is the routed path's and its contract
    # says so (test_model_families.py).
    shared = replace(model, shared_experts=1, shared_expert_intermediate_size=32)
    assert backend().admit(shared, DP1, runtime("cuda", True)).admitted


def test_it_declines_an_expert_map_that_is_not_linear(model: MoeModel) -> None:
    def round_robin(ep: int, rank: int, experts: int) -> tuple[int, Any, None]:
        mapping = torch.full((experts,), -1, dtype=torch.int32)
        mapping[rank::ep] = torch.arange(experts // ep, dtype=torch.int32)
        return experts // ep, mapping, None

    fm = "vllm.model_executor.layers.fused_moe"
    b = backend(**{f"{fm}.expert_map_manager:determine_expert_map": round_robin})
    admission = b.admit(model, DP2_RANK1, runtime("cuda", True))
    assert any("not the linear placement" in r for r in admission.reasons)


def test_selection_reports_why_the_modular_adapter_declined(model: MoeModel) -> None:
    with pytest.raises(AdmissionError) as caught:
        select_backend("vllm-modular", model, DP1, runtime(), candidates=[VllmModularBackend()])
    text = str(caught.value)
    assert "vllm-modular: declined: needs a CUDA device" in text
    assert "vLLM is not importable" in text


# -- build and components --------------------------------------------------------------------


def test_it_builds_the_dp1_components_and_records_local_execution(model: MoeModel) -> None:
    session = backend().build(model, DP1, runtime(), "float32")
    try:
        assert session.components == ("gate_routing", "experts")
        assert session.choice.prepare_kind == NO_DP_EP
        described = session.describe()
        assert described["native"] is True
        assert described["native_backend"] == "TRITON"
        assert described["expert_class"].endswith("TritonExperts")
        assert "0 device activities" in described["local_execution"]["prepare"]
        assert described["experts_activities_per_forward"] == {"fused_moe_kernel": 1}
        # vLLM's own FusedMoEKernel.apply copies the workspace output; the boundary does not.
        extra = described["native_kernel_apply_comparison"][
            "activities_only_in_FusedMoEKernel.apply"
        ]
        assert extra == {"copy": 1}
        with pytest.raises(ValueError, match="finalize_copy"):
            session.local_forward("finalize_copy", 4)
    finally:
        session.close()


def test_dp1_experts_write_into_the_callers_buffer(model: MoeModel) -> None:
    session = backend().build(model, DP1, runtime(), "float32")
    try:
        session.allocate_banks(4)
        prepared = session.prepare_experts(stimulus(model, DP1, 5, 2, 10))
        out = session.run_experts(prepared, 3)
        assert out is prepared.output
        reference = session.reference_experts(prepared)
        assert reference is prepared.reference_output and reference is not out
        assert torch.equal(out, reference)
        assert out.abs().sum() > 0
    finally:
        session.close()


@pytest.mark.parametrize(
    ("prepare", "expected"),
    [
        (fv.CopyingPrepare, "alias identity lost"),
        (fv.QuantizingPrepare, "launches 1 device activities"),
        (fv.LaunchingPrepare, "not a no-op"),
    ],
)
def test_it_rejects_a_dp1_prepare_that_is_not_an_input_preserving_no_op(
    model: MoeModel, prepare: type, expected: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(fv.PREPARE_CLASSES, "no_dp_ep", prepare)
    with pytest.raises(CapabilityError, match=expected):
        backend().build(model, DP1, runtime(), "float32")


def test_it_rejects_a_reduction_that_needs_more_work(model: MoeModel) -> None:
    fm = "vllm.model_executor.layers.fused_moe"
    b = backend(
        **{
            f"{fm}.oracle.unquantized:select_unquantized_moe_backend": lambda cfg: (
                "TRITON",
                fv.ContiguousExperts,
            )
        }
    )
    with pytest.raises(CapabilityError, match="not the no-op reduction"):
        b.build(model, DP1, runtime(), "float32")


def test_it_rejects_a_finalize_that_copies(
    model: MoeModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    class CopyingFinalize(fv.NoDPEP):
        def finalize(
            self,
            output: Any,
            fused_expert_output: Any,
            topk_weights: Any,
            topk_ids: Any,
            apply_router_weight_on_input: bool,
            weight_and_reduce_impl: Any,
        ) -> None:
            fv.launch("copy")
            output.copy_(fused_expert_output)

    monkeypatch.setitem(fv.PREPARE_CLASSES, "no_dp_ep", CopyingFinalize)
    with pytest.raises(CapabilityError, match="native finalize launches 1 device activities"):
        backend().build(model, DP1, runtime(), "float32")


def test_it_builds_a_dp_ep_rank_with_its_own_expert_map(model: MoeModel) -> None:
    session = backend().build(model, DP2_RANK1, runtime(), "float32")
    try:
        assert session.components == ("gate_routing", "experts", "finalize_copy")
        assert session.choice.prepare_kind == NAIVE_DP_EP
        assert session.local_experts == 4
        assert session.expert_map.tolist() == [-1, -1, -1, -1, 0, 1, 2, 3]
        assert session.prepare_finalize.num_dispatchers == 2
        described = session.describe()
        assert described["moe_parallel_config"]["ep_rank"] == 1
        assert "collectives" in described["boundaries"]["experts"]
        session.allocate_banks(2)
        prepared = session.prepare_experts(stimulus(model, DP2_RANK1, 6, 3, 7))
        assert torch.equal(session.run_experts(prepared, 1), session.reference_experts(prepared))
        copy = session.local_forward("finalize_copy", 5)
        assert torch.equal(copy.run(), copy.reference())
        gate = session.local_forward("gate_routing", 5)
        _weights, ids = gate.run()
        assert ids.shape == (5, model.top_k) and ids.dtype == torch.int32
        assert all(torch.equal(a, b) for a, b in zip(gate.run(), gate.reference(), strict=True))
    finally:
        session.close()


def test_bank_clones_keep_aliases_offsets_and_strides() -> None:
    storage = torch.arange(24, dtype=torch.float32)
    first = storage[:12].view(3, 4)
    second = storage[12:].view(4, 3).t()  # shares the storage, offset 12, transposed strides
    banks = clone_banks((first, second), 2)
    for bank in banks:
        a, b = bank
        assert a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()
        assert a.untyped_storage().data_ptr() != first.untyped_storage().data_ptr()
        assert (a.storage_offset(), b.storage_offset()) == (0, 12)
        assert b.stride() == second.stride()
        assert torch.equal(a, first) and torch.equal(b, second)
    assert banks[0][0].data_ptr() != banks[1][0].data_ptr()


def test_the_protocol_verifies_and_times_every_bank_of_a_point(model: MoeModel) -> None:
    # The PointMeter drives the session as the acquisition does, on CPU operator timing.
    session = backend().build(model, DP2_RANK1, runtime(), "float32")
    try:
        geometry = ExpertGeometry.for_target(model.global_experts, model.top_k, DP2_RANK1)
        mapping = linear_expert_map(model.global_experts, 2, 1)
        settings = ProtocolSettings(rounds=1, iterations=1)
        session.allocate_banks(4)
        meter = PointMeter(session, settings, geometry, mapping, banks=2, device="cpu")
        point = PlanPoint("experts", 4, 2, 5)
        results, _, checked = meter.measure(point, context_order(point, 1), verify=True)
        assert checked == 4
        assert {r.arm for r in results} == {"B", "2B"}
        assert all(t > 0 for r in results for t in r.forwards_us)
    finally:
        session.close()


def test_it_plans_the_finalize_copy_for_dp_ep_only(model: MoeModel) -> None:
    assert VllmModularBackend().components(model, DP1) == ("gate_routing", "experts")
    assert VllmModularBackend().components(model, DP2_RANK1) == (
        "gate_routing",
        "experts",
        "finalize_copy",
    )


def test_a_build_time_refusal_is_an_adapter_refusal(
    model: MoeModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    from acquisition.adapters.base import AdapterRefusal

    monkeypatch.setitem(fv.PREPARE_CLASSES, "no_dp_ep", fv.CopyingPrepare)
    with pytest.raises(AdapterRefusal) as caught:
        backend().build(model, DP1, runtime(), "float32")
    assert any("alias identity lost" in r for r in caught.value.reasons)
