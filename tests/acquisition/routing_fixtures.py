"""A tiny MoE model folder and prompt file for routing-capture tests, and a captured profile."""

from __future__ import annotations

import json
import random
from pathlib import Path

from moetables.profiles import RoutingProfile, read_profile


def write_tiny_moe(folder: Path, *, experts: int = 16, top_k: int = 4, layers: int = 3) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    config = {
        "model_type": "qwen3_moe",
        "_name_or_path": "test/tiny-moe",
        "hidden_size": 16,
        "moe_intermediate_size": 8,
        "num_experts": experts,
        "num_experts_per_tok": top_k,
        "num_hidden_layers": layers,
        "vocab_size": 512,
    }
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def write_prompts(path: Path, count: int = 12, seed: int = 1) -> Path:
    rng = random.Random(seed)
    lines = [
        json.dumps({"prompt_token_ids": [rng.randrange(512) for _ in range(rng.randrange(4, 48))]})
        for _ in range(count)
    ]
    lines.insert(3, "a plain text prompt, tokenized by bytes")
    path.write_text("\n".join(lines) + "\n")
    return path


def capture_profile(tmp: Path, **model: int) -> RoutingProfile:
    """A real capture through the torch engine (the same seam, writer and reader)."""
    from acquisition.routing_capture.cli import main

    folder = write_tiny_moe(tmp / "model", **model)
    prompts = write_prompts(tmp / "prompts.jsonl")
    out = tmp / "tiny.routing.npz"
    code = main(
        [
            str(folder),
            "--prompts",
            str(prompts),
            "--engine",
            "torch",
            "--max-tokens",
            "4",
            "--batch-prompts",
            "4",
            "--out",
            str(out),
            "--no-progress-bar",
        ]
    )
    assert code == 0
    return read_profile(out)
