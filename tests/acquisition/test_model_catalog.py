"""The model catalog: shipped config.json geometry and local folders (R3, R4)."""

from __future__ import annotations

from pathlib import Path

import pytest
from tiny_moe import write_model

from acquisition.catalog import CatalogError, catalog_models, resolve_model, variant_for_dtype

CATALOG = [
    "Qwen/Qwen1.5-MoE-A2.7B",
    "Qwen/Qwen3-235B-A22B",
    "Qwen/Qwen3-30B-A3B-Instruct-2507",
    "Qwen/Qwen3-30B-A3B-Instruct-2507-FP8",
    "allenai/OLMoE-1B-7B-0924",
    "deepseek-ai/DeepSeek-V2-Lite",
    "mistralai/Mixtral-8x7B-Instruct-v0.1",
    "mistralai/Mixtral-8x7B-v0.1",
    "openai/gpt-oss-20b",
]


def test_it_ships_every_catalog_model_with_its_sources() -> None:
    assert catalog_models() == CATALOG
    for name in CATALOG:
        model = resolve_model(name)
        assert model.source == "catalog"
        assert model.source_url and model.source_url.startswith("https://huggingface.co/" + name)
        assert isinstance(model.sequence_parallel, bool)  # R3: declared for every model


@pytest.mark.parametrize(
    ("name", "hidden", "width", "experts", "top_k", "dtype"),
    [
        ("Qwen/Qwen3-30B-A3B-Instruct-2507", 2048, 768, 128, 8, "bfloat16"),
        ("Qwen/Qwen3-235B-A22B", 4096, 1536, 128, 8, "bfloat16"),
        ("mistralai/Mixtral-8x7B-v0.1", 4096, 14336, 8, 2, "bfloat16"),
        ("mistralai/Mixtral-8x7B-Instruct-v0.1", 4096, 14336, 8, 2, "bfloat16"),
        ("Qwen/Qwen1.5-MoE-A2.7B", 2048, 1408, 60, 4, "bfloat16"),
        ("allenai/OLMoE-1B-7B-0924", 2048, 1024, 64, 8, None),
        ("deepseek-ai/DeepSeek-V2-Lite", 2048, 1408, 64, 6, "bfloat16"),
        ("openai/gpt-oss-20b", 2880, 2880, 32, 4, "bfloat16"),
    ],
)
def test_it_reads_the_geometry_of_each_architecture(
    name: str, hidden: int, width: int, experts: int, top_k: int, dtype: str | None
) -> None:
    model = resolve_model(name)
    assert (model.hidden_size, model.expert_intermediate_size) == (hidden, width)
    assert (model.global_experts, model.top_k, model.dtype) == (experts, top_k, dtype)


def test_it_knows_routing_and_expert_features_the_config_does_not_spell_out() -> None:
    assert resolve_model("mistralai/Mixtral-8x7B-v0.1").renormalize is True
    assert resolve_model("allenai/OLMoE-1B-7B-0924").renormalize is False
    assert resolve_model("deepseek-ai/DeepSeek-V2-Lite").shared_experts == 2
    oss = resolve_model("openai/gpt-oss-20b")
    assert (oss.expert_bias, oss.router_bias, oss.quantization) == (True, True, "mxfp4")
    assert oss.activation == "swigluoai"


def test_it_resolves_a_local_folder(tmp_path: Path) -> None:
    folder = write_model(tmp_path / "m", num_experts=6)
    model = resolve_model(str(folder))
    assert model.name == "test/tiny-moe"
    assert model.global_experts == 6 and model.source.startswith("local:")
    assert len(model.config_sha256) == 64


def test_it_rejects_an_unknown_model_naming_the_catalog() -> None:
    with pytest.raises(CatalogError, match="Qwen/Qwen3-30B-A3B-Instruct-2507"):
        resolve_model("nobody/nothing")


def test_it_rejects_a_dense_config(tmp_path: Path) -> None:
    folder = tmp_path / "dense"
    folder.mkdir()
    (folder / "config.json").write_text('{"model_type": "llama", "hidden_size": 64}')
    with pytest.raises(CatalogError, match=r"expert width|expert count"):
        resolve_model(str(folder))


def test_it_requires_a_sequence_parallel_declaration_only_where_it_matters(tmp_path: Path) -> None:
    folder = tmp_path / "undeclared"
    write_model(folder)
    (folder / "catalog.json").write_text('{"name": "x/undeclared"}')
    model = resolve_model(str(folder))
    assert model.uses_sequence_parallel(1, 2) is False  # TP1: never SP
    assert model.uses_sequence_parallel(2, 1) is False  # DP1: never SP
    with pytest.raises(CatalogError, match="sequence_parallel"):
        model.uses_sequence_parallel(2, 2)
    assert resolve_model("Qwen/Qwen3-30B-A3B-Instruct-2507").uses_sequence_parallel(2, 2)


def test_it_names_variants_like_the_published_bundles() -> None:
    assert variant_for_dtype("bfloat16") == "bf16"
    with pytest.raises(CatalogError):
        variant_for_dtype("int8")
