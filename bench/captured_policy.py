"""Cost of the ``captured`` routing policy in a batch estimate (issue 15 part 3).

    PYTHONPATH=. .venv/bin/python bench/captured_policy.py [--steps 10000]

A synthetic skewed profile of Qwen3-30B-A3B's geometry (E=128, top-8; 8 layers; 400 steps of
decode and prefill sizes), then ``estimate_batch`` at DP2 of the H200 bundle for random steps
under balanced, captured (drawn: mostly between captured sizes, so tokens are sampled) and
captured's expectation. Prints steps per second for each.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from moetables import ComponentTables
from moetables.profiles import RoutingProfile

H200 = Path(__file__).resolve().parents[1] / "bundles/H200/Qwen/Qwen3-30B-A3B-Instruct-2507/bf16"


def skewed_profile(steps: int = 400, layers: int = 8, seed: int = 0) -> RoutingProfile:
    rng = np.random.default_rng(seed)
    sizes = np.where(
        rng.random(steps) < 0.8, rng.integers(1, 128, steps), rng.integers(128, 4096, steps)
    )
    counts = np.zeros((steps, layers, 128), dtype=np.int64)
    bias = [-1.2 * np.log(rng.permutation(128) + 1.0) for _ in range(layers)]
    for layer in range(layers):
        for s, n in enumerate(sizes):
            # k distinct experts per token, by Gumbel top-k of the skewed log-weights
            scores = bias[layer][None, :] + rng.gumbel(size=(n, 128))
            picked = np.argpartition(-scores, 7, axis=1)[:, :8]
            counts[s, layer] = np.bincount(picked.ravel(), minlength=128)
    return RoutingProfile.create(
        model={
            "name": "synthetic",
            "global_experts": 128,
            "top_k": 8,
            "layers": list(range(layers)),
        },
        workload={"prompts_sha256": "", "prompts": 0, "prompt_tokens": 0, "generated_tokens": 0},
        step_tokens=sizes,
        counts=counts,
        router="synthetic zipf 1.2",
        source="synthetic",
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=10_000)
    args = parser.parse_args()
    t = time.perf_counter()
    profile = skewed_profile()
    print(
        f"profile: {profile.steps} steps x {len(profile.layers)} layers in {time.perf_counter() - t:.1f} s"
    )
    tables = ComponentTables(H200)
    rng = np.random.default_rng(1)
    steps = rng.integers(1, 1024, size=(args.steps, 2))
    for name, options in (
        ("balanced", {"policy": "balanced"}),
        (
            "captured",
            {"policy": "captured", "profile": profile, "layer": 7, "tile_cost_us": "none"},
        ),
        (
            "captured, all layers",
            {"policy": "captured", "profile": profile, "tile_cost_us": "none"},
        ),
        (
            "captured expectation",
            {"policy": "captured", "profile": profile, "layer": 7, "captured_expectation": True},
        ),
    ):
        t = time.perf_counter()
        tables.estimate_batch(steps, tp=1, dp=2, **options)
        dt = time.perf_counter() - t
        print(f"{name:22s} {args.steps} steps in {dt:.2f} s: {args.steps / dt:,.0f} steps/s")


if __name__ == "__main__":
    main()
