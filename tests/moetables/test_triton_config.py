"""vLLM 0.26.0's Triton MoE configuration choice, embedded (issue 20, issue 18): the planner's
kernel-step rule and the lookups' tile model read one table (R10: plan points from
configuration only). Where vLLM's source is present (``VLLM_SRC`` or /work/vllm-src/vllm), the
embedding and the selection are checked against vLLM's own files and functions."""

from __future__ import annotations

import ast
import json
import os
import sys
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from moetables.tiles import block_size_m
from moetables.triton_config import (
    KernelShape,
    TritonConfig,
    TritonConfigError,
    config_dtype,
    config_file_name,
    default_config,
    device_family,
    tuned_files,
)

VLLM = Path(os.environ.get("VLLM_SRC", "/work/vllm-src/vllm"))
FUSED_MOE = VLLM / "model_executor/layers/fused_moe"
needs_vllm = pytest.mark.skipif(
    not (FUSED_MOE / "fused_moe.py").is_file(), reason="vLLM 0.26.0 source not unpacked here"
)
FIELDS = ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "GROUP_SIZE_M", "num_warps", "num_stages")
BLOCK = (128, 128)
# The shipped and planned targets: (local experts, expert width, config dtype, block shape).
SHAPES = [
    (128, 768, None, None),  # Qwen3-30B-A3B TP1/DP1
    (64, 768, None, None),  # its DP2/EP2 ranks
    (32, 768, None, None),
    (16, 768, None, None),
    (128, 768, "fp8_w8a8", BLOCK),  # Qwen3-30B-A3B-FP8 DP1
    (64, 768, "fp8_w8a8", BLOCK),
    (60, 1408, None, None),  # Qwen1.5-MoE-A2.7B
    (30, 1408, None, None),
    (8, 14336, None, None),  # Mixtral-8x7B DP1
    (4, 14336, None, None),
    (64, 1408, None, None),  # DeepSeek-V2-Lite
    (64, 1024, None, None),  # OLMoE
    (128, 1536, None, None),  # Qwen3-235B-A22B
]


def h200(shape: tuple[int, int, str | None, tuple[int, int] | None]) -> KernelShape:
    return KernelShape("NVIDIA_H200", *shape)


# -- without vLLM: what the embedded table says ---------------------------------------------------


def test_every_h200_variant_is_one_config_family() -> None:
    for label in ("H200", "NVIDIA H200", "NVIDIA_H200", "NVIDIA H200 NVL", "h200"):
        assert device_family(label) == "NVIDIA_H200", label
    assert device_family("NVIDIA H100 80GB HBM3") == "NVIDIA_H100_80GB_HBM3"
    assert device_family("RTXPRO6000") == "RTXPRO6000"


def test_the_file_key_is_local_experts_width_dtype_and_block() -> None:
    assert h200(SHAPES[0]).source == "E=128,N=768,device_name=NVIDIA_H200.json"
    assert h200(SHAPES[1]).source == "get_default_config"  # 64 local experts: no H200 file
    assert (
        h200(SHAPES[4]).source
        == "E=128,N=768,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128,128].json"
    )
    assert h200(SHAPES[5]).source == "get_default_config"
    assert h200((8, 14336, None, None)).source == "E=8,N=14336,device_name=NVIDIA_H200.json"
    assert h200((4, 14336, None, None)).source == "get_default_config"
    assert h200((60, 1408, None, None)).source == "get_default_config"
    assert config_file_name(8, 14336, "NVIDIA_H200", "fp8_w8a8") == (
        "E=8,N=14336,device_name=NVIDIA_H200,dtype=fp8_w8a8.json"
    )


def test_mixtral_at_ep1_runs_its_tuned_file() -> None:
    """E=8,N=14336 (vLLM 0.26.0): key 2 has BLOCK_SIZE_M 32, so rows 2 and 3 run other tiles than
    rows 1 and 4; the default config would give 16 up to 32 rows."""
    shape = h200((8, 14336, None, None))
    assert [shape.config(n).block_m for n in (1, 2, 3, 4)] == [16, 32, 32, 16]
    assert default_config(2, 8).block_m == 16


def test_block_fp8_selects_its_own_file_and_clamps_block_k() -> None:
    fp8 = h200(SHAPES[4])
    # Keys 128 (BLOCK_SIZE_M 16) and 256 (64): the switch is at 192 | 193.
    assert (fp8.config(192).block_m, fp8.config(193).block_m) == (16, 64)
    # The default for block FP8: 16 rows up to M = 64, then 64; K tile = the quant block.
    ep2 = h200(SHAPES[5])
    assert (ep2.config(64).block_m, ep2.config(65).block_m) == (16, 64)
    assert {ep2.config(n).block_k for n in range(1, 4097)} == {128}
    assert default_config(4, 64, "fp8_w8a8", BLOCK) == TritonConfig(16, 64, 128, 1, 4, 4)
    assert default_config(17, 64, "fp8_w8a8", BLOCK) == TritonConfig(16, 128, 128, 32, 4, 3)


def test_the_tile_model_reads_the_same_table() -> None:
    """One owner: moetables.tiles.block_size_m is the shape's configuration's BLOCK_SIZE_M."""
    for shape in SHAPES:
        e, n, dtype, block = shape
        for rows in (1, 2, 3, 5, 33, 97, 129, 192, 193, 257, 385, 513, 769, 2048, 8192):
            assert block_size_m(rows, e, n, dtype=dtype, block_shape=block) == (
                h200(shape).config(rows).block_m
            ), (shape, rows)


def test_only_bf16_and_block_fp8_are_modelled() -> None:
    assert config_dtype("bfloat16") == (None, None)
    assert config_dtype("bfloat16", "fp8", (128, 128)) == ("fp8_w8a8", (128, 128))
    for args in (("float32",), ("bfloat16", "fp8", None), ("bfloat16", "gptq", None)):
        with pytest.raises(TritonConfigError):
            config_dtype(*args)  # type: ignore[arg-type]


def test_the_embedding_holds_every_h200_file_in_file_order() -> None:
    files = tuned_files()
    assert len(files) == 51
    assert all("device_name=NVIDIA_H200" in name for name in files)
    # vLLM breaks ties between keys by their order in the file: all H200 files are ascending.
    assert all(list(t) == sorted(t) for t in files.values())


# -- against vLLM 0.26.0's own files and functions -----------------------------------------------


@needs_vllm
def test_the_embedded_files_equal_vllms() -> None:
    configs = FUSED_MOE / "configs"
    names = sorted(p.name for p in configs.glob("*device_name=NVIDIA_H200[,.]*json"))
    assert sorted(tuned_files()) == names
    for name in names:
        raw = json.loads((configs / name).read_text())
        raw.pop("triton_version", None)
        assert list(tuned_files()[name]) == [int(k) for k in raw], name
        for key, c in raw.items():
            assert tuned_files()[name][int(key)] == TritonConfig(*(c[f] for f in FIELDS))


def _vllm_functions(*names: str) -> dict[str, Callable[..., Any]]:
    """The named top-level functions of vLLM's fused_moe.py, compiled from its source with the
    platform stubbed as the measuring hosts run it (CUDA, H200, no overrides)."""
    source = (FUSED_MOE / "fused_moe.py").read_text()
    tree = ast.parse(source)
    picked = [
        node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name in names
    ]
    for node in picked:
        node.decorator_list = []
    assert {n.name for n in picked} == set(names)
    configs = FUSED_MOE / "configs"

    def get_moe_configs(
        e: int, n: int, dtype: str | None, block_n: int | None = None, block_k: int | None = None
    ) -> dict[int, Any] | None:
        # vLLM's, less the user folder and logging: the shipped file, triton_version dropped.
        shape = [block_n, block_k] if block_n and block_k else None
        path = configs / namespace["get_config_file_name"](e, n, dtype, shape)
        if not path.exists():
            return None
        raw = json.loads(path.read_text())
        raw.pop("triton_version", None)
        return {int(k): v for k, v in raw.items()}

    namespace: dict[str, Any] = {
        "envs": types.SimpleNamespace(VLLM_BATCH_INVARIANT=False),
        "current_platform": types.SimpleNamespace(is_rocm=lambda: False),
        "get_device_name_as_file_name": lambda: "NVIDIA_H200",
        "get_moe_configs": get_moe_configs,
        "Any": Any,
    }
    exec(compile(ast.Module(body=picked, type_ignores=[]), str(FUSED_MOE), "exec"), namespace)
    return {name: namespace[name] for name in names}


@needs_vllm
def test_the_choice_equals_try_get_optimal_moe_config(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every shipped and planned shape, every row count up to 8,192: the configuration vLLM's
    own ``try_get_optimal_moe_config`` returns (with BLOCK_SIZE_K clamped to the quantization
    block as ``invoke_fused_moe_triton_kernel`` compiles it)."""
    fns = _vllm_functions(
        "get_config_file_name", "get_default_config", "try_get_optimal_moe_config"
    )
    package = types.ModuleType("vllm.model_executor.layers.fused_moe")
    package.get_config = lambda: None  # type: ignore[attr-defined]
    for name in ("vllm", "vllm.model_executor", "vllm.model_executor.layers"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, package.__name__, package)
    checked = 0
    for shape in SHAPES:
        e, n, dtype, block = shape
        ours = h200(shape)
        assert (ours.tuned is not None) == (
            fns["get_config_file_name"](e, n, dtype, list(block) if block else None)
            in {p.name for p in (FUSED_MOE / "configs").iterdir()}
        )
        for rows in range(1, 8193):
            c = fns["try_get_optimal_moe_config"](
                (e, 2 * n, 2048), (e, 2048, n), 8, dtype, rows, list(block) if block else None
            )
            k = min(c["BLOCK_SIZE_K"], min(block)) if block else c["BLOCK_SIZE_K"]
            expected = TritonConfig(
                c["BLOCK_SIZE_M"], c["BLOCK_SIZE_N"], k, c["GROUP_SIZE_M"], c["num_warps"],
                c["num_stages"],
            )  # fmt: skip
            assert ours.config(rows) == expected, (shape, rows)
            checked += 1
    assert checked == len(SHAPES) * 8192


def test_a_tables_kernel_shape_comes_from_its_contract() -> None:
    """The lookups' tile model (issue 18): whole experts at any TP (full expert parallelism,
    vLLM's MoE TP size 1), the checkpoint's quantization choosing the FP8 file."""
    from moetables.tiles import contract_kernel_shape

    bf16 = {"hardware": "H200", "geometry": {"expert_intermediate_size": 768, "dtype": "bfloat16"}}
    assert contract_kernel_shape(bf16, 128).source == "E=128,N=768,device_name=NVIDIA_H200.json"
    assert contract_kernel_shape(bf16, 64).width == 768  # a TP2/DP1/EP2 rank too
    fp8 = {
        "hardware": "H200",
        "geometry": {
            "expert_intermediate_size": 768,
            "dtype": "bfloat16",
            "quantization": "fp8",
            "weight_block_size": [128, 128],
        },
    }
    shape = contract_kernel_shape(fp8, 128)
    assert (shape.dtype, shape.block_shape) == ("fp8_w8a8", (128, 128))
    assert shape.tuned is not None
