"""Grouped top-k routing (DeepSeek): vllm-modular times the router vLLM's wrapper builds.

vLLM's DeepseekV2MoE always asks its router factory for ``use_grouped_topk=True`` with the
config's ``n_group`` and ``topk_group`` (1 where absent), so DeepSeek-V2-Lite runs
GroupedTopKRouter, whose unfused path launches several kernels where the plain fused top-k
launches one. A gate_routing row timed with the plain router would be another layer's time
(R21: the component is the gate projection and the router's ``select_experts`` as vLLM runs
them).
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
import torch
import vllm_fakes as fv
from tiny_moe import write_model

from acquisition.adapters.vllm_modular_backend import VllmModularBackend
from acquisition.adapters.vllm_modular_native import router_grouping
from acquisition.catalog import CatalogError, resolve_model
from acquisition.options.measurable import declared_reasons
from moetables.geometry import MoeTarget

TP1 = MoeTarget(tp=1, dp=1, ep=1, rank=0, sequence_parallel=False)


def _deepseek(tmp_path: Path, **overrides: object) -> Path:
    fields: dict[str, object] = {
        "model_type": "deepseek_v2",
        "architectures": ["DeepseekV2ForCausalLM"],
        "n_routed_experts": 4,
        "num_experts_per_tok": 2,
        "norm_topk_prob": False,
        "n_group": 1,
        "topk_group": 1,
        "routed_scaling_factor": 1.0,
        "topk_method": "greedy",
    }
    fields.update(overrides)
    folder = write_model(tmp_path / "deepseek-tiny", **fields)
    config = json.loads((folder / "config.json").read_text())
    config.pop("num_experts")  # DeepSeek counts its routed experts as n_routed_experts
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def test_the_catalog_reads_deepseek_v2_lite_as_a_grouped_router() -> None:
    model = resolve_model("deepseek-ai/DeepSeek-V2-Lite")
    assert model.grouped_topk == (1, 1)
    assert model.routed_scaling_factor == 1.0 and model.score_correction_bias is False
    # catalog.json names the scoring; the architecture's grouping survives it.
    assert model.geometry["routing"] == {
        "scoring": "softmax",
        "renormalize": False,
        "grouped_topk": {"num_expert_group": 1, "topk_group": 1},
        "routed_scaling_factor": 1.0,
        "score_correction_bias": False,
    }
    # Plain top-k models keep the contract's two routing keys, byte for byte as shipped.
    for name in ("Qwen/Qwen3-30B-A3B-Instruct-2507", "mistralai/Mixtral-8x7B-Instruct-v0.1"):
        plain = resolve_model(name)
        assert plain.grouped_topk is None
        assert set(plain.geometry["routing"]) == {"scoring", "renormalize"}
        assert router_grouping(plain, "cpu") == {}


def test_the_router_factory_gets_what_deepseek_v2_moe_passes(tmp_path: Path) -> None:
    model = resolve_model(str(_deepseek(tmp_path, n_group=2, topk_group=1)))
    assert router_grouping(model, "cpu") == {
        "use_grouped_topk": True,
        "num_expert_group": 2,
        "topk_group": 1,
        "routed_scaling_factor": 1.0,
    }
    biased = resolve_model(str(_deepseek(tmp_path / "v3", topk_method="noaux_tc")))
    bias = router_grouping(biased, "cpu")["e_score_correction_bias"]
    assert bias.dtype == torch.float32 and bias.shape == (4,)


def test_the_modular_session_times_the_grouped_router(tmp_path: Path) -> None:
    model = resolve_model(str(_deepseek(tmp_path)))
    backend = VllmModularBackend(
        resolve=fv.resolver(fv.modular_namespace()), activities=fv.activities
    )
    fv.ROUTER_CALLS.clear()
    session = backend.build(model, TP1, fv.fake_runtime(), "float32")
    try:
        assert fv.ROUTER_CALLS[-1]["use_grouped_topk"] is True
        assert (fv.ROUTER_CALLS[-1]["num_expert_group"], fv.ROUTER_CALLS[-1]["topk_group"]) == (
            1,
            1,
        )
        fv.LAUNCHES.clear()
        weights, ids = session.gate_routing(torch.randn(5, model.hidden_size))
        # The grouped router's kernels, not the plain router's one topk_softmax.
        assert "topk_softmax" not in fv.LAUNCHES
        assert Counter(fv.LAUNCHES)["group_topk"] == 1
        assert ids.shape == (5, 2) and weights.shape == (5, 2)
        routing = session.describe()["routing"]
    finally:
        session.close()
    assert routing["grouped_topk"] == {"num_expert_group": 1, "topk_group": 1}
    assert routing["routing_method"] == "DeepSeekV3"


def test_one_group_chooses_as_a_plain_top_k(tmp_path: Path) -> None:
    """Why the textbook reference may still measure DeepSeek-V2-Lite: one kept group is the
    plain top-k, and the fake's grouped router (vLLM's math) agrees with it exactly."""
    logits = torch.randn(64, 4, generator=torch.Generator().manual_seed(0))
    grouped = fv.GroupedTopKRouter(2, 4, False, 1, 1, 1.0, None)
    plain = fv.FusedTopKRouter(2, 4, False)
    hidden = torch.zeros(64, 8)
    g_weights, g_ids = grouped.select_experts(hidden, logits)
    p_weights, p_ids = plain.select_experts(hidden, logits)
    assert torch.equal(g_ids, p_ids) and torch.equal(g_weights, p_weights)
    assert declared_reasons("torch-reference", resolve_model(str(_deepseek(tmp_path))), TP1) == []


def test_the_reference_declines_grouping_that_changes_the_choice(tmp_path: Path) -> None:
    model = resolve_model(
        str(_deepseek(tmp_path, n_group=2, topk_group=1, routed_scaling_factor=2.5))
    )
    reasons = declared_reasons("torch-reference", model, TP1)
    assert any("keeps 1 of 2 expert groups" in r for r in reasons)
    assert any("routed_scaling_factor 2.5" in r for r in reasons)
    # vLLM's own router runs it: the modular path is not refused for grouping.
    assert declared_reasons("vllm-modular", model, TP1) == []


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"n_group": 0}, "n_group must be a positive integer"),
        ({"n_group": 2, "topk_group": 3}, "topk_group 3 is more than the 2 expert groups"),
        ({"routed_scaling_factor": "big"}, "routed_scaling_factor must be a positive number"),
    ],
)
def test_a_bad_grouping_is_refused_by_name(
    tmp_path: Path, overrides: dict[str, object], message: str
) -> None:
    with pytest.raises(CatalogError, match=message):
        resolve_model(str(_deepseek(tmp_path, **overrides)))


def test_a_catalog_json_grouping_flag_must_be_a_boolean(tmp_path: Path) -> None:
    folder = _deepseek(tmp_path)
    catalog = json.loads((folder / "catalog.json").read_text())
    catalog["routing"] = {"grouped_topk": "yes"}
    (folder / "catalog.json").write_text(json.dumps(catalog))
    with pytest.raises(CatalogError, match=r"routing\.grouped_topk must be true or false"):
        resolve_model(str(folder))
