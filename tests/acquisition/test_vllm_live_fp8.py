"""Block-FP8 experts through ``vllm-live`` on CPU (issue 20, item 4; R25-R27, R33).

The fake engine's MoE layer is turned into a block-FP8 one (FP8 weights, float32 block scales
in the kernel's quant config, a quantizing prepare), as vLLM's Fp8MoEMethod leaves it after
``process_weights_after_loading``; each bank must own its scales and run them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import pytest
import torch
import vllm_fakes as fv
import vllm_fp8_fakes as f8
from tiny_moe import write_model

from acquisition.adapters.base import EngineLimits
from acquisition.adapters.vllm_capabilities import LIVE_SYMBOLS, CapabilityError, probe_surface
from acquisition.adapters.vllm_fp8 import _block_quantize
from acquisition.adapters.vllm_live import VllmLiveSession
from acquisition.catalog import MoeModel, resolve_model
from acquisition.protocol.stimulus import routing_stimulus
from moetables.geometry import ExpertGeometry, MoeTarget, linear_expert_map

TP1 = MoeTarget(tp=1, dp=1, ep=1, rank=0, sequence_parallel=False)
LIMITS = EngineLimits(max_num_batched_tokens=64, max_num_seqs=16, kv_cache_memory_bytes=1 << 30)
QUANT = {"quant_method": "fp8", "weight_block_size": [128, 128], "activation_scheme": "dynamic"}


class Fp8LLM(fv.FakeLLM):
    """The fake engine with its MoE layer processed to block FP8."""

    extra: ClassVar[dict[str, Any]] = {}

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.model = fv.TinyModel(experts=4, top_k=2, hidden=256, width=128)
        runner = self.model.layers[0].mlp.experts
        routed = runner.routed_experts
        q13, s13 = _block_quantize(routed.w13_weight.data, (128, 128), f8.FP8)
        q2, s2 = _block_quantize(routed.w2_weight.data, (128, 128), f8.FP8)
        routed.w13_weight = torch.nn.Parameter(q13, requires_grad=False)
        routed.w2_weight = torch.nn.Parameter(q2, requires_grad=False)
        config = f8.Fp8QuantConfig(w1_scale=s13, w2_scale=s2, block_shape=[128, 128])
        for name, value in Fp8LLM.extra.items():
            setattr(config, name, value)
        experts = f8.Fp8TritonExperts(runner.moe_config, config)
        routed.quant_method = fv.UnquantizedMethod(f8.Fp8Kernel(f8.Fp8NoDPEP(), experts))


@pytest.fixture
def model(tmp_path: Path) -> MoeModel:
    folder = write_model(
        tmp_path / "tiny-fp8",
        architectures=["Qwen3MoeForCausalLM"],
        hidden_size=256,
        moe_intermediate_size=128,
        num_hidden_layers=4,
        max_position_embeddings=512,
        quantization_config=QUANT,
    )
    return resolve_model(str(folder))


def session(model: MoeModel) -> VllmLiveSession:
    surface = probe_surface(LIVE_SYMBOLS, fv.resolver(fv.live_namespace(**{"vllm:LLM": Fp8LLM})))
    return VllmLiveSession(
        model, TP1, fv.fake_runtime(), "float32", LIMITS, surface, check_ownership=False
    )


def test_fp8_banks_clone_the_scales_and_equal_the_native_method(model: MoeModel) -> None:
    live = session(model)
    try:
        assert live.w13.dtype == torch.float8_e4m3fn
        weights = live.w13.numel() + live.w2.numel()
        scales = 4 * (live.w13_scale.numel() + live.w2_scale.numel())
        assert live.expert_weight_bytes() == weights + scales
        live.allocate_banks(3)
        geometry = ExpertGeometry.for_target(model.global_experts, model.top_k, TP1)
        mapping = linear_expert_map(model.global_experts, 1, 0)
        prepared = live.prepare_experts(routing_stimulus(geometry, mapping, 6, 3, 12, seed=2))
        reference = live.reference_experts(prepared).clone()
        for bank in range(3):
            kernel = live.bank_experts[bank]
            assert kernel is not live.layer.kernel
            assert kernel.prepare_finalize is live.layer.kernel.prepare_finalize
            assert kernel.fused_experts.quant_config.w1_scale is live.banks[bank][2]
            assert torch.equal(live.run_experts(prepared, bank), reference)
        live.banks[2][3].mul_(2)  # the bank's own w2 scales: its output moves, the others' not
        assert not torch.equal(live.run_experts(prepared, 2), reference)
        assert torch.equal(live.run_experts(prepared, 0), reference)
        described = live.describe()
        assert described["dtypes"]["expert_weights"] == "float8_e4m3fn"
        assert described["dtypes"]["weight_scales"] == "float32"
        quant = described["quantization"]
        assert quant["weight_block_shape"] == [128, 128]
        assert quant["weight_scale_shapes"] == {"w13": [4, 2, 2], "w2": [4, 2, 1]}
        assert "per token and 128-column group" in quant["activation_quantization"]
    finally:
        live.close()
        Fp8LLM.extra = {}


def test_static_activation_scales_are_declined(model: MoeModel) -> None:
    Fp8LLM.extra = {"a1_scale": torch.ones(1)}
    try:
        with pytest.raises(CapabilityError, match="holds a1_scale"):
            session(model)
    finally:
        Fp8LLM.extra = {}
