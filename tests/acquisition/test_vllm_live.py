"""The vllm-live adapter on CPU, with a fake in-process engine shaped like vLLM's (R25-R28, R31).

The fake engine's model has the structure the adapter looks for (a parent block whose MoE
runner holds a gate, a router and routed experts with a modular kernel), so the engine
arguments, the layer search, the state checks, the equality of cloned banks with the native
method and the elided wrapper all run without vLLM or a GPU.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import vllm_fakes as fv
from tiny_moe import write_model

from acquisition.adapters.base import AdapterRefusal, EngineLimits
from acquisition.adapters.vllm_capabilities import LIVE_SYMBOLS, CapabilityError, probe_surface
from acquisition.adapters.vllm_live import WRAPPER, VllmLiveSession
from acquisition.adapters.vllm_live_backend import VllmLiveBackend
from acquisition.adapters.vllm_live_config import (
    declared_wrapper_work,
    effective_limits,
    smallest_moe_prefix,
)
from acquisition.adapters.vllm_live_layer import find_moe_layer, layer_reasons
from acquisition.adapters.vllm_ownership import nested_ownership
from acquisition.catalog import MoeModel, resolve_model
from acquisition.protocol.attribution import (
    AttributionError,
    DeviceActivity,
    HostCall,
    ProfiledWindow,
    TimedRange,
)
from acquisition.protocol.stimulus import routing_stimulus
from moetables.geometry import ExpertGeometry, MoeTarget, linear_expert_map

TP1 = MoeTarget(tp=1, dp=1, ep=1, rank=0, sequence_parallel=False)
LIMITS = EngineLimits(max_num_batched_tokens=64, max_num_seqs=16, kv_cache_memory_bytes=1 << 30)


runtime = fv.fake_runtime


@pytest.fixture
def model(tmp_path: Path) -> MoeModel:
    folder = write_model(
        tmp_path / "tiny",
        architectures=["Qwen3MoeForCausalLM"],
        num_hidden_layers=4,
        max_position_embeddings=512,
    )
    return resolve_model(str(folder))


def session(model: MoeModel, **namespace: Any) -> VllmLiveSession:
    surface = probe_surface(LIVE_SYMBOLS, fv.resolver(fv.live_namespace(**namespace)))
    return VllmLiveSession(model, TP1, runtime(), "float32", LIMITS, surface, check_ownership=False)


# -- admission -------------------------------------------------------------------------------


def test_it_declines_other_targets_and_missing_limits(model: MoeModel) -> None:
    backend = VllmLiveBackend(resolve=fv.resolver(fv.live_namespace()))
    dp2 = MoeTarget(tp=1, dp=2, ep=2, rank=0, sequence_parallel=False)
    admission = backend.admit(model, dp2, runtime("cuda", True))
    assert any("TP1/DP1/EP1 only" in r for r in admission.reasons)
    assert any("engine limits" in r for r in admission.reasons)
    # The command's limits travel on the runtime description (no process-wide setting).
    assert backend.admit(model, TP1, runtime("cuda", True, limits=LIMITS)).admitted


def test_it_declines_without_vllm_or_a_gpu(model: MoeModel) -> None:
    admission = VllmLiveBackend(limits=LIMITS).admit(model, TP1, runtime())
    assert any("needs a CUDA device" in r for r in admission.reasons)
    assert any("vLLM is not importable" in r for r in admission.reasons)


def test_it_admits_quantized_checkpoints_but_not_biased_experts(tmp_path: Path) -> None:
    backend = VllmLiveBackend(limits=LIMITS, resolve=fv.resolver(fv.live_namespace()))
    quantized = write_model(
        tmp_path / "q", architectures=["X"], quantization_config={"quant_method": "fp8"}
    )
    assert backend.admit(resolve_model(str(quantized)), TP1, runtime("cuda", True)).admitted
    gpt_oss = resolve_model("openai/gpt-oss-20b")
    admission = backend.admit(gpt_oss, TP1, runtime("cuda", True))
    assert any("biased experts" in r for r in admission.reasons)


@pytest.mark.parametrize(
    ("config", "layers"),
    [
        ({"num_hidden_layers": 48, "decoder_sparse_step": 1, "mlp_only_layers": []}, 1),
        ({"num_hidden_layers": 27, "first_k_dense_replace": 1}, 2),
        ({"num_hidden_layers": 8, "mlp_only_layers": [0, 1]}, 3),
        ({"num_hidden_layers": 8, "decoder_sparse_step": 2}, 2),
    ],
)
def test_the_component_engine_is_the_smallest_moe_prefix(
    config: dict[str, Any], layers: int
) -> None:
    assert smallest_moe_prefix(config) == layers


# -- the engine and its layer ------------------------------------------------------------------


def test_a_config_without_a_context_leaves_max_model_len_to_vllm(tmp_path: Path) -> None:
    """DeepSeek-V2-Lite's catalog config states no max_position_embeddings: the engine was
    given 4,096 and vLLM refused it (its derived default is 2,048; H200 session 12). Now the
    argument is left out and vLLM derives it, unless the user names one."""
    folder = write_model(tmp_path / "no-context", architectures=["Qwen3MoeForCausalLM"])
    live = session(resolve_model(str(folder)))
    try:
        assert "max_model_len" not in fv.FakeLLM.created[-1]
        assert live.describe()["engine"]["actual"]["max_model_len"] == 2048
    finally:
        live.close()


def test_it_starts_the_engine_with_the_requested_limits(model: MoeModel) -> None:
    live = session(model)
    try:
        arguments = fv.FakeLLM.created[-1]
        assert arguments["max_num_batched_tokens"] == 64
        assert arguments["max_num_seqs"] == 16
        assert arguments["max_model_len"] == 512  # the checkpoint's context, never reduced
        assert arguments["kv_cache_memory_bytes"] == 1 << 30
        assert arguments["load_format"] == "dummy"
        assert arguments["hf_overrides"] == {"num_hidden_layers": 1}
        described = live.describe()
        assert described["engine"]["actual"]["max_num_batched_tokens"] == 64
        assert described["layer_path"] == "layers.0.mlp.experts"
        assert live.components == ("gate_routing", "experts", "wrapper")
    finally:
        live.close()


def test_cloned_banks_equal_the_exact_native_method(model: MoeModel) -> None:
    live = session(model)
    try:
        live.allocate_banks(4)
        geometry = ExpertGeometry.for_target(model.global_experts, model.top_k, TP1)
        mapping = linear_expert_map(model.global_experts, 1, 0)
        prepared = live.prepare_experts(routing_stimulus(geometry, mapping, 6, 3, 12, seed=2))
        reference = live.reference_experts(prepared)
        for bank in range(4):
            assert torch.equal(live.run_experts(prepared, bank), reference)
        assert live.banks[0][0].data_ptr() != live.w13.data_ptr()
    finally:
        live.close()


def test_the_wrapper_launches_only_the_parents_own_work(model: MoeModel) -> None:
    live = session(model)
    try:
        wrapper = live.local_forward("wrapper", 5)
        fv.LAUNCHES.clear()
        out = wrapper.run()
        assert fv.LAUNCHES == ["wrapper_scale"]  # no gate, router or expert kernels
        fv.LAUNCHES.clear()
        assert torch.equal(out, wrapper.reference())
        # Every elided scope is restored afterwards: no instance attribute is left behind.
        layer = live.layer
        assert "forward" not in layer.gate.__dict__
        assert "select_experts" not in layer.router.__dict__
        assert "forward_modular" not in layer.routed_experts.__dict__
        gate = live.local_forward("gate_routing", 5)
        assert all(torch.equal(a, b) for a, b in zip(gate.run(), gate.reference(), strict=True))
    finally:
        live.close()


def test_a_state_change_is_an_error(model: MoeModel) -> None:
    live = session(model)
    try:
        with torch.no_grad():
            live.layer.routed_experts.w2_weight.mul_(1.0)  # bumps the version counter
        with pytest.raises(CapabilityError, match="w2_weight"):
            live.check_state()
    finally:
        live.close()


def test_a_swapped_callable_is_an_error(model: MoeModel) -> None:
    live = session(model)
    try:
        live.layer.router.select_experts = lambda *a, **k: None  # type: ignore[method-assign]
        with pytest.raises(CapabilityError, match="select_experts"):
            live.check_state()
    finally:
        live.close()


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (lambda r: setattr(r, "eplb_state", object()), "EPLB"),
        (lambda r: setattr(r.moe_config, "is_lora_enabled", True), "LoRA"),
        (lambda r: setattr(r.moe_config, "has_bias", True), "biased experts"),
        (
            lambda r: setattr(r.routed_experts, "apply_router_weight_on_input", True),
            "input-weighted",
        ),
        (lambda r: setattr(r, "_fse_fuse_gate", True), "fused shared gate"),
        (lambda r: setattr(r.moe_config, "hidden_dim", 32), "padded hidden"),
        (lambda r: setattr(r.moe_config, "intermediate_size_per_partition", 4), "tensor-sharded"),
        (lambda r: setattr(r.routed_experts, "global_num_experts", 6), "redundant experts"),
        (
            lambda r: setattr(r.routed_experts.quant_method.moe_kernel, "is_monolithic", True),
            "monolithic",
        ),
        (lambda r: setattr(r.routed_experts, "expert_map", torch.zeros(4)), "expert map"),
        (
            lambda r: setattr(
                r.routed_experts.quant_method.moe_kernel, "use_deferred_moe_finalize", True
            ),
            "deferred finalization",
        ),
        (
            lambda r: setattr(r.routed_experts.quant_method, "defer_moe_finalize", lambda: True),
            "cannot be read",
        ),
    ],
)
def test_it_rejects_layers_it_cannot_verify(model: MoeModel, mutate: Any, expected: str) -> None:
    tiny = fv.TinyModel()
    layer = find_moe_layer(tiny)
    surface = probe_surface(LIVE_SYMBOLS, fv.resolver(fv.live_namespace()))
    assert layer_reasons(layer, model, surface) == []
    mutate(layer.runner)
    reasons = layer_reasons(layer, model, surface)
    assert any(expected in r for r in reasons), reasons


def test_a_rejected_layer_fails_the_build(model: MoeModel, monkeypatch: pytest.MonkeyPatch) -> None:
    original = fv.MoERunner.__init__

    def with_lora(self: Any, *args: Any) -> None:
        original(self, *args)
        self.moe_config.is_lora_enabled = True

    monkeypatch.setattr(fv.MoERunner, "__init__", with_lora)
    with pytest.raises(CapabilityError, match="LoRA"):
        session(model)


# -- launch ownership --------------------------------------------------------------------------


def _window(
    ranges: list[tuple[str, int, int]], launches: list[tuple[int, int]], durations: list[int]
) -> ProfiledWindow:
    """Ranges (name, start, end); launch i at time t with correlation c; activity i lasts d."""
    return ProfiledWindow(
        ranges=[TimedRange(name, 1, s, e) for name, s, e in ranges],
        launches=[HostCall("cudaLaunchKernel", 1, t, t + 1, c) for t, c in launches],
        activities=[
            DeviceActivity(f"k{i}", 1000 + i, d, c)
            for i, ((_, c), d) in enumerate(zip(launches, durations, strict=True))
        ],
    )


def test_ownership_goes_to_the_innermost_scope_and_is_conserved() -> None:
    window = _window(
        [("parent", 0, 100), ("gate", 10, 20), ("experts", 30, 60)],
        [(5, 1), (12, 2), (35, 3), (40, 4), (70, 5), (200, 6)],
        [7, 11, 13, 17, 19, 23],
    )
    owned = nested_ownership(window)
    assert owned.per_scope_ns == {"parent": 7 + 19, "gate": 11, "experts": 13 + 17}
    assert owned.outside_ns == 23
    assert owned.total_ns == sum([7, 11, 13, 17, 19, 23])


def test_scopes_that_overlap_without_nesting_are_an_error() -> None:
    window = _window([("gate", 0, 50), ("experts", 40, 90)], [(45, 1)], [5])
    with pytest.raises(AttributionError, match="overlap without nesting"):
        nested_ownership(window)


# -- components and limits ---------------------------------------------------------------------


def test_the_limits_come_from_the_command_and_the_engine_options(model: MoeModel) -> None:
    command = EngineLimits(max_num_batched_tokens=2048, max_num_seqs=128)
    assert effective_limits(runtime(limits=command)) == EngineLimits(
        2048, 128, kv_cache_memory_bytes=1 << 30
    )
    # The engine options of the command line arrive on the same limits.
    options = EngineLimits(
        2048, 128, kv_cache_memory_bytes=1 << 29, attention_backend="TRITON_ATTN"
    )
    merged = effective_limits(runtime(limits=options))
    assert merged == options
    # An adapter's own limits fill only what the runtime leaves open.
    own = EngineLimits(1, 1, attention_backend="FLASH_ATTN", max_model_len=4096)
    merged = effective_limits(runtime(limits=options), own)
    assert merged is not None
    assert (merged.max_num_batched_tokens, merged.max_num_seqs) == (2048, 128)
    assert (merged.attention_backend, merged.max_model_len) == ("TRITON_ATTN", 4096)
    backend = VllmLiveBackend(resolve=fv.resolver(fv.live_namespace()))
    assert backend.admit(model, TP1, runtime("cuda", True, limits=command)).admitted
    assert effective_limits(runtime()) is None


def test_the_wrapper_is_planned_where_the_checkpoint_declares_work_for_it(
    model: MoeModel, tmp_path: Path
) -> None:
    backend = VllmLiveBackend()
    assert not declared_wrapper_work(model)
    assert backend.components(model, TP1) == ("gate_routing", "experts")
    shared = write_model(tmp_path / "shared", shared_expert_intermediate_size=32)
    assert declared_wrapper_work(resolve_model(str(shared)))
    assert backend.components(resolve_model(str(shared)), TP1) == (
        "gate_routing",
        "experts",
        "wrapper",
    )


def test_the_traced_wrapper_must_match_the_planned_components(model: MoeModel) -> None:
    live = session(model)
    try:
        live.ownership = [{"tokens": 8, "activities": {"wrapper": {"scale": 1}}}]
        live.components = ("gate_routing", "experts")
        with pytest.raises(AdapterRefusal, match="declares none"):
            live._check_wrapper_declaration()
        live.ownership = [{"tokens": 8, "activities": {"wrapper": {}}}]
        live.components = ("gate_routing", "experts", WRAPPER)
        with pytest.raises(AdapterRefusal, match="cannot be zero"):
            live._check_wrapper_declaration()
        live.components = ("gate_routing", "experts")
        live._check_wrapper_declaration()
        assert "no table row" in live.describe()["boundaries"][WRAPPER]
    finally:
        live.close()


def test_the_selection_list_carries_the_vllm_adapters_first() -> None:
    from acquisition.adapters import BACKENDS, NATIVE_BACKENDS, backend_names

    assert [b.name for b in NATIVE_BACKENDS] == ["vllm-modular", "vllm-live"]
    assert backend_names()[:3] == ["auto", "vllm-modular", "vllm-live"]
    assert BACKENDS[-1].name == "torch-reference"


def test_the_model_class_is_inspected_in_process_through_the_public_registry(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 19: vLLM's registry gets the very class it would load, inspected here (no
    subprocess re-importing vLLM); an unknown architecture or a registry error changes nothing."""
    import sys
    import types

    from acquisition.adapters.vllm_live_config import register_model_classes

    class Model(torch.nn.Module):
        pass

    class Lazy:
        def load_model_cls(self) -> type:
            return Model

    class Registry:
        def __init__(self) -> None:
            self.models: dict[str, Any] = {"Qwen3MoeForCausalLM": Lazy(), "Broken": Lazy()}
            self.registered: list[tuple[str, type]] = []

        def register_model(self, arch: str, cls: type) -> None:
            if arch == "Broken":
                raise TypeError("refused")
            self.registered.append((arch, cls))

    registry = Registry()
    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(ModelRegistry=registry))
    done = register_model_classes(["Qwen3MoeForCausalLM", "Unknown", "Broken"])
    assert done == ["Qwen3MoeForCausalLM"]
    assert registry.registered == [("Qwen3MoeForCausalLM", Model)]
    monkeypatch.delitem(sys.modules, "vllm")
    monkeypatch.setattr("builtins.__import__", _refuse_vllm(__import__))
    assert register_model_classes(["Qwen3MoeForCausalLM"]) == []


def _refuse_vllm(original: Any) -> Any:
    def guarded(name: str, *args: Any, **kwargs: Any) -> Any:
        if name == "vllm" or name.startswith("vllm."):
            raise ImportError("no vLLM here")
        return original(name, *args, **kwargs)

    return guarded
