"""A tiny MoE model folder (config.json and catalog.json) for acquisition tests."""

from __future__ import annotations

import json
from pathlib import Path


def write_model(folder: Path, **overrides: object) -> Path:
    """A tiny Qwen3-style MoE checkpoint description (no weights: acquisition needs none)."""
    folder.mkdir(parents=True, exist_ok=True)
    config = {
        "model_type": "qwen3_moe",
        "hidden_size": 16,
        "moe_intermediate_size": 8,
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "norm_topk_prob": True,
        "torch_dtype": "float32",
        "hidden_act": "silu",
    }
    catalog = {"name": "test/tiny-moe", "sequence_parallel": False}
    for key, value in overrides.items():
        (catalog if key in ("name", "sequence_parallel") else config)[key] = value
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "catalog.json").write_text(json.dumps(catalog))
    return folder
