"""Issue 20, item 2: Qwen1.5-MoE-A2.7B and Mixtral-8x7B-Instruct-v0.1 through the vLLM adapters.

Catalog geometry as the public config.json files declare it (R3, R4), the 60-expert EP2 split,
the plans and weight banks on an H200, what the modular path says about a shared expert, and
the live path's wrapper ownership proof (R26) on a block shaped like vLLM 0.26.0's
Qwen2MoeSparseMoeBlock, all on CPU with the fakes of ``vllm_fakes``.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch
import vllm_fakes as fv
from tiny_moe import write_model

from acquisition.adapters.base import EngineLimits
from acquisition.adapters.vllm_capabilities import LIVE_SYMBOLS, CapabilityError, probe_surface
from acquisition.adapters.vllm_live import VllmLiveSession
from acquisition.adapters.vllm_live_backend import VllmLiveBackend
from acquisition.adapters.vllm_modular_backend import VllmModularBackend
from acquisition.adapters.vllm_modular_native import resolve_native
from acquisition.catalog import CATALOG_ROOT, MoeModel, resolve_model
from acquisition.cli import build_parser
from acquisition.cli import prepare as prepare_command
from acquisition.protocol.banks import physical_banks
from moetables.geometry import MoeTarget, linear_expert_map

QWEN15 = "Qwen/Qwen1.5-MoE-A2.7B"
MIXTRAL = "mistralai/Mixtral-8x7B-Instruct-v0.1"
TP1 = MoeTarget(tp=1, dp=1, ep=1, rank=0, sequence_parallel=False)
H200_L2 = 62_914_560  # docs/h200-runs.md: torch.cuda.get_device_properties(0).L2_cache_size
H200_MEMORY = 143_771 * (1 << 20)
LIMITS = EngineLimits(max_num_batched_tokens=64, max_num_seqs=16, kv_cache_memory_bytes=1 << 30)


def dp2(rank: int) -> MoeTarget:
    return MoeTarget(tp=1, dp=2, ep=2, rank=rank, sequence_parallel=False)


# -- catalog ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "hidden", "width", "experts", "top_k", "renormalize", "shared"),
    [
        (QWEN15, 2048, 1408, 60, 4, False, (1, 5632, "sigmoid")),
        (MIXTRAL, 4096, 14336, 8, 2, True, (0, 0, None)),
    ],
)
def test_it_reads_the_geometry_the_public_configs_declare(
    name: str,
    hidden: int,
    width: int,
    experts: int,
    top_k: int,
    renormalize: bool,
    shared: tuple[int, int, str | None],
) -> None:
    model = resolve_model(name)
    assert (model.hidden_size, model.expert_intermediate_size) == (hidden, width)
    assert (model.global_experts, model.top_k, model.dtype) == (experts, top_k, "bfloat16")
    assert model.renormalize is renormalize and model.scoring == "softmax"
    assert (
        model.shared_experts,
        model.shared_expert_intermediate_size,
        model.shared_expert_gate,
    ) == shared
    # R3: neither vLLM wrapper has a sequence-parallel branch, and the catalog says so.
    assert model.sequence_parallel is False
    assert model.uses_sequence_parallel(2, 2) is False
    assert model.source_url and model.source_url.startswith(f"https://huggingface.co/{name}/")


def test_the_catalog_entries_keep_only_config_fields_and_name_their_sources() -> None:
    for name in (QWEN15, MIXTRAL):
        folder = CATALOG_ROOT / name
        config = json.loads((folder / "config.json").read_text())
        declared = json.loads((folder / "catalog.json").read_text())
        assert declared["name"] == name
        assert "vLLM 0.26.0" in declared["sequence_parallel_source"]
        # What the adapters derive is not copied into config.json (nothing invented there).
        assert not {"sequence_parallel", "routing", "shared_expert_gate"} & config.keys()
        assert config["architectures"] and config["torch_dtype"] == "bfloat16"
    qwen = json.loads((CATALOG_ROOT / QWEN15 / "catalog.json").read_text())
    assert all(url.startswith("https://huggingface.co/") for url in qwen["source_copies"])
    # The Mixtral entry is pinned to the commit whose file was read.
    assert "/blob/eba92302a2861cdc0098cc54bc9f17cb2c47eb61/" in resolve_model(MIXTRAL).source_url


def test_only_shared_expert_models_gain_shared_expert_geometry() -> None:
    assert "shared_expert_intermediate_size" not in resolve_model(MIXTRAL).geometry
    assert "shared_expert_gate" not in resolve_model("Qwen/Qwen3-30B-A3B-Instruct-2507").geometry
    qwen = resolve_model(QWEN15).geometry
    assert (qwen["shared_experts"], qwen["shared_expert_intermediate_size"]) == (1, 5632)
    assert qwen["shared_expert_gate"] == "sigmoid"
    # DeepSeek fuses its two shared experts into one MLP of twice the routed width (vLLM's
    # DeepseekV2MoE), and has no shared-expert gate.
    deepseek = resolve_model("deepseek-ai/DeepSeek-V2-Lite")
    assert (deepseek.shared_experts, deepseek.shared_expert_intermediate_size) == (2, 2816)
    assert deepseek.shared_expert_gate is None


# -- expert placement, plans and banks -------------------------------------------------------


def test_vllm_splits_60_experts_30_30_over_ep2() -> None:
    """R4: vLLM's linear map (the fake mirrors determine_expert_map) gives each rank 30."""
    model = resolve_model(QWEN15)
    surface = VllmModularBackend(resolve=fv.resolver(fv.modular_namespace())).surface()
    owned = []
    for rank in (0, 1):
        choice = resolve_native(
            surface,
            model,
            dp2(rank),
            device=torch.device("cpu"),
            dtype=torch.bfloat16,
            all2all_backend="allgather_reducescatter",
        )
        assert choice.local_experts == 30
        assert choice.expert_map == tuple(linear_expert_map(60, 2, rank))
        owned.append([e for e, local in enumerate(choice.expert_map) if local >= 0])
    assert owned == [list(range(30)), list(range(30, 60))]


def _plans(name: str, backend: str, dps: str, factor: int) -> list[Any]:
    argv = [
        "slice", name, "--hardware", "H200", "--tp", "1", "--tp-refresh", "1", "--group", "moe",
        "--max-num-batched-tokens", "2048", "--max-num-seqs", "128", "--moe-grid-factor",
        str(factor), "--cudagraph-capture-sizes", "1,2,4,8,16,32,64,128,256", "--dp", dps,
        "--backend", backend, "--out-root", "/nonexistent", "--moe-kernel-steps", "off",
    ]  # fmt: skip
    _, plans = prepare_command(build_parser().parse_args(argv), argv)
    return plans


@pytest.mark.parametrize(
    ("name", "points", "local"),
    [(QWEN15, [68, 587, 587], [60, 30, 30]), (MIXTRAL, [49, 334, 334], [8, 4, 4])],
)
def test_the_factor_2_plans_of_scripts_h200_models(
    name: str, points: list[int], local: list[int]
) -> None:
    """The point counts docs/h200-runs.md estimates the device time from."""
    plans = _plans(name, "vllm-modular", "1,2", 2)
    assert [len(p.points) for p in plans] == points
    assert [p.geometry.local_experts for p in plans] == local
    assert [p.axes.expert_maximum for p in plans] == [2048, 4096, 4096]


@pytest.mark.parametrize(
    ("name", "banks", "bank_bytes"),
    [(QWEN15, 4, 60 * 3 * 2048 * 1408 * 2), (MIXTRAL, 4, 8 * 3 * 4096 * 14336 * 2)],
)
def test_the_weight_banks_fit_one_h200(name: str, banks: int, bank_bytes: int) -> None:
    """R17, R33: bank count from the H200's L2 and the expert bytes; the DP1 bank is the
    largest (every expert local). A Mixtral bank is 2.8 GB: the L2 is overflowed by any two
    weight sets, so the minimum of two sets per arm holds and 2B = 4 banks are cloned."""
    for plan in _plans(name, "vllm-modular", "1,2", 2):
        local = plan.geometry.local_experts
        expert_bytes = bank_bytes // resolve_model(name).global_experts
        count = physical_banks(
            (p.activated_experts for p in plan.points if p.is_expert),
            expert_bytes,
            H200_L2,
            local,
        )
        assert count == banks
        # The guard of acquisition/acquire.py: clones plus 1 GiB reserved, plus the session's
        # own weights, far below the H200's memory.
        assert (count + 1) * expert_bytes * local + (1 << 30) < H200_MEMORY // 8


# -- the modular path and a shared expert ----------------------------------------------------


@pytest.fixture
def shared_model(tmp_path: Path) -> MoeModel:
    folder = write_model(
        tmp_path / "qwen2-tiny",
        model_type="qwen2_moe",
        architectures=["Qwen2MoeForCausalLM"],
        num_experts=4,  # the fake engine's block (vllm_fakes.Qwen2MoeBlock)
        shared_expert_intermediate_size=12,
        norm_topk_prob=False,
        num_hidden_layers=2,
        max_position_embeddings=512,
    )
    return resolve_model(str(folder))


def test_the_modular_contract_says_the_shared_expert_is_not_measured(
    shared_model: MoeModel,
) -> None:
    """The method's modular components are the routed path's; a shared expert is surrounding
    native work that only the live wrapper holds. Admitted, timed without it, and said so."""
    backend = VllmModularBackend(
        resolve=fv.resolver(fv.modular_namespace()), activities=fv.activities
    )
    assert backend.admit(shared_model, dp2(1), fv.fake_runtime("cuda", True)).admitted
    assert backend.components(shared_model, dp2(1)) == ("gate_routing", "experts", "finalize_copy")
    session = backend.build(shared_model, TP1, fv.fake_runtime(), "float32")
    try:
        described = session.describe()
    finally:
        session.close()
    statement = described["shared_experts"]
    assert statement["measured"] is False and statement["component"] is None
    assert (statement["count"], statement["intermediate_size"], statement["gate"]) == (
        1,
        12,
        "sigmoid",
    )
    assert "shared_experts" in described["excluded"]
    assert "vllm-live wrapper" in statement["statement"]


def test_the_torch_reference_says_the_same(shared_model: MoeModel) -> None:
    """The textbook layer has no shared expert either; its contract says so too."""
    from acquisition.adapters.torch_reference import TorchReferenceBackend

    session = TorchReferenceBackend().build(shared_model, TP1, fv.fake_runtime(), "float32")
    try:
        statement = session.describe()["shared_experts"]
    finally:
        session.close()
    assert statement["measured"] is False and statement["intermediate_size"] == 12


def test_a_model_without_shared_experts_keeps_the_contract_shape(tmp_path: Path) -> None:
    model = resolve_model(str(write_model(tmp_path / "plain")))
    backend = VllmModularBackend(
        resolve=fv.resolver(fv.modular_namespace()), activities=fv.activities
    )
    session = backend.build(model, TP1, fv.fake_runtime(), "float32")
    try:
        assert "shared_experts" not in session.describe()
    finally:
        session.close()


# -- the live path: wrapper ownership with a shared expert (R26) -----------------------------


@pytest.fixture
def qwen2_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fake engine builds a Qwen2-MoE-shaped block, and ownership traces run on CPU."""
    monkeypatch.setattr(fv.FakeLLM, "model_class", fv.TinyQwen2MoeModel)
    monkeypatch.setattr("acquisition.adapters.vllm_ownership.trace", fv.fake_trace)


def live_session(model: MoeModel, **kwargs: Any) -> VllmLiveSession:
    surface = probe_surface(LIVE_SYMBOLS, fv.resolver(fv.live_namespace()))
    return VllmLiveSession(
        model,
        TP1,
        fv.fake_runtime(),
        "float32",
        LIMITS,
        surface,
        components=VllmLiveBackend().components(model, TP1),
        **kwargs,
    )


SHARED_KERNELS = {"shared_gate_up", "shared_act_and_mul", "shared_down", "gemm", "sigmoid_mul"}


@pytest.mark.usefixtures("qwen2_engine")
def test_the_wrapper_owns_the_shared_expert_and_its_gate(shared_model: MoeModel) -> None:
    live = live_session(shared_model)  # the ownership traces run in the build
    try:
        assert live.components == ("gate_routing", "experts", "wrapper")
        # Traced at 1 token (vLLM's side stream: after the routed kernel) and at 64 (the main
        # stream, before the router): either way the wrapper holds the shared MLP, its gate,
        # the sigmoid scale and the sum, and nothing of the gate, router or routed kernel.
        by_tokens = {o["tokens"]: o for o in live.ownership}
        assert sorted(by_tokens) == [1, 64]
        for traced in by_tokens.values():
            wrapper = traced["activities"]["wrapper"]
            assert set(wrapper) == SHARED_KERNELS | {"add"}
            assert "fused_moe_kernel" in traced["activities"]["experts"]
            assert not SHARED_KERNELS & set(traced["activities"]["experts"])
            assert traced["activities"]["gate"] == {"gemm": 1}
            assert traced["wrapper_us"] > 0
            total = traced["gate_routing_us"] + traced["experts_us"] + traced["wrapper_us"]
            assert total + traced["outside_scopes_us"] == traced["native_forward_total_us"]
        assert by_tokens[1]["streams"]["parent"] == [fv.MAIN_STREAM, fv.SIDE_STREAM]
        assert by_tokens[64]["streams"]["parent"] == [fv.MAIN_STREAM]
        # The timed wrapper launches exactly that and returns the native output.
        wrapper = live.local_forward("wrapper", 5)
        fv.LAUNCHES.clear()
        out = wrapper.run()
        assert Counter(fv.LAUNCHES) == Counter(
            ["shared_gate_up", "shared_act_and_mul", "shared_down", "gemm", "sigmoid_mul", "add"]
        )
        fv.LAUNCHES.clear()
        assert torch.equal(out, wrapper.reference())
        statement = live.describe()["shared_experts"]
        assert statement["measured"] is True and statement["component"] == "wrapper"
    finally:
        live.close()


@pytest.mark.usefixtures("qwen2_engine")
def test_a_shared_expert_inside_the_routed_kernel_is_refused(
    shared_model: MoeModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    """If the shared expert ran inside the routed-kernel scope (an overlapping finalize), the
    experts rows would time a call without it and no row would hold it: refused at build."""
    original = fv.RoutedExperts.forward_modular

    def with_shared_inside(self: Any, x: Any, *args: Any, **kwargs: Any) -> Any:
        out = original(self, x, *args, **kwargs)
        fv.launch("shared_gate_up")
        return out

    monkeypatch.setattr(fv.RoutedExperts, "forward_modular", with_shared_inside)
    with pytest.raises(CapabilityError, match=r"experts component .* does not launch"):
        live_session(shared_model)


@pytest.mark.usefixtures("qwen2_engine")
def test_a_declared_shared_expert_the_engine_does_not_run_is_refused(
    shared_model: MoeModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The checkpoint declares a shared expert; an engine block without one leaves the wrapper
    empty, and a table row cannot be zero."""

    monkeypatch.setattr(fv.FakeLLM, "model_class", _GateOnParentModel)
    with pytest.raises(CapabilityError, match="cannot be zero"):
        live_session(shared_model)


@pytest.mark.usefixtures("qwen2_engine")
def test_mixtral_shaped_layers_have_no_wrapper_row(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Mixtral's block does nothing of its own at TP1: gate_routing and experts only, and the
    ownership trace confirms the empty wrapper."""
    monkeypatch.setattr(fv.FakeLLM, "model_class", _GateOnParentModel)
    mixtral_like = resolve_model(
        str(
            write_model(
                tmp_path / "mixtral-tiny",
                model_type="mixtral",
                architectures=["MixtralForCausalLM"],
                num_hidden_layers=2,
                max_position_embeddings=512,
            )
        )
    )
    assert VllmLiveBackend().components(resolve_model(MIXTRAL), TP1) == ("gate_routing", "experts")
    live = live_session(mixtral_like)
    try:
        assert live.components == ("gate_routing", "experts")
        assert all(not o["activities"]["wrapper"] for o in live.ownership)
        assert "shared_experts" not in live.describe()
    finally:
        live.close()


class _GateOnParent(torch.nn.Module):
    """MixtralMoE's shape: the gate on the parent, a runner with no work of its own."""

    def __init__(self) -> None:
        super().__init__()
        block = fv.Qwen2MoeBlock()
        self.gate = block.gate
        self.experts = block.experts
        self.experts._shared_layer = None

    def forward(self, hidden: Any) -> Any:
        logits, _ = self.gate(hidden)
        weights, ids = self.experts.router.select_experts(
            hidden_states=hidden, router_logits=logits
        )
        return self.experts.routed_experts.forward_modular(
            x=hidden, topk_weights=weights, topk_ids=ids
        )


class _GateOnParentModel(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList([fv.Layer(_GateOnParent())])


@pytest.mark.usefixtures("qwen2_engine")
def test_the_live_path_publishes_wrapper_rows_for_the_shared_expert(
    shared_model: MoeModel, tmp_path: Path
) -> None:
    """Admission aside (it needs CUDA), the whole live acquisition on CPU: the plan gains the
    wrapper, the build proves ownership, the protocol measures every component and the bundle
    holds wrapper rows, the traced forwards' conservation and the shared-expert statement."""
    import dataclasses

    import yaml

    from acquisition.acquire import acquire_target
    from acquisition.adapters import AdmissionReport
    from acquisition.adapters.base import Admission
    from acquisition.options.resolve import plan_target
    from acquisition.progress import ProgressReporter
    from moetables.bundle import validate_bundle

    args = [
        "slice", shared_model.source.removeprefix("local:"), "--hardware", "CPU", "--tp", "1",
        "--tp-refresh", "1", "--dp", "1", "--max-num-batched-tokens", "16", "--max-num-seqs", "4",
        "--moe-rounds", "1", "--measurement-iterations", "1", "--warmup-cycles", "0",
        "--backend", "vllm-live", "--device", "cpu", "--cache-bytes", "1",
        "--quality-tolerance", "0.9", "--cudagraph-mode", "NONE", "--no-progress-bar",
        "--out-root", str(tmp_path / "out"),
    ]  # fmt: skip
    request, (plan,) = prepare_command(build_parser().parse_args(args), args)
    backend = VllmLiveBackend(limits=LIMITS, resolve=fv.resolver(fv.live_namespace()))
    plan = plan_target(request, plan.target, backend.components(shared_model, TP1))
    # One point per component keeps CI at seconds.
    few = [next(p for p in plan.points if p.component == c) for c in plan.components]
    small = dataclasses.replace(plan, points=tuple(few))
    report = AdmissionReport(plan.target, "vllm-live", (Admission.accept(backend.name),))
    progress = ProgressReporter(None, bar=False, total=len(few))
    runtime = fv.fake_runtime(limits=EngineLimits(16, 4, kv_cache_memory_bytes=1 << 30))
    try:
        outcome = acquire_target(request, small, backend, runtime, report, progress)
    finally:
        progress.close()
    assert outcome.published
    validate_bundle(request.bundle_dir)
    rows = (request.bundle_dir / "tp1/moe_components/dp1_ep1_rank0_sp0/components.csv").read_text()
    assert sum(line.startswith("wrapper,eager,") for line in rows.splitlines()) == 1
    meta = yaml.safe_load((request.bundle_dir / "meta.yaml").read_text())
    (entry,) = meta["per_tp"][1]["moe_components"]["entries"]
    assert entry["contract"]["components"] == ["gate_routing", "experts", "wrapper"]
    assert entry["contract"]["backend"]["shared_experts"]["component"] == "wrapper"
    assert entry["contract"]["geometry"]["shared_expert_intermediate_size"] == 12
    traced = entry["contract"]["backend"]["launch_ownership"]
    assert [t["tokens"] for t in traced] == [1, 16]
    conservation = request.bundle_dir / "tp1/moe_components/dp1_ep1_rank0_sp0/conservation.csv"
    assert len(conservation.read_text().splitlines()) == 1 + len(traced)
