"""Host seconds of the routing stimuli of a shipped plan, and sameness with an older build.

    PYTHONPATH=. python3 bench/acquisition_stimulus_cost.py [--bundle bundles/H200-vllm-modular-f2] \
        [--against GIT_REV]

Builds every expert point's stimulus (``routing_stimulus``, seeded per point as the protocol
does) of every target planned in the bundle's samples (``plan.json``), and prints the CPU
seconds. With ``--against``, ``acquisition/protocol/stimulus.py`` of that git revision is
loaded too: its seconds are printed and every stimulus must be identical (ids and weights), so
a faster build never meets a point differently (issue 19).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tarfile
import tempfile
import time
import types
from pathlib import Path
from typing import Any

import numpy as np

from acquisition.protocol import stimulus
from moetables.geometry import ExpertGeometry, MoeTarget, linear_expert_map

MODEL = "Qwen/Qwen3-30B-A3B-Instruct-2507"


def plans(bundle: Path, scratch: Path) -> list[dict[str, Any]]:
    with tarfile.open(bundle / MODEL / "bf16.acquisition-samples.tar.gz") as tar:
        tar.extractall(scratch, filter="data")
    return [json.loads(p.read_text()) for p in sorted(scratch.rglob("plan.json"))]


def older(revision: str) -> Any:
    source = subprocess.run(
        ["git", "show", f"{revision}:acquisition/protocol/stimulus.py"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    module = types.ModuleType("older_stimulus")
    sys.modules[module.__name__] = module  # its dataclasses look their module up
    exec(compile(source, f"{revision}:stimulus.py", "exec"), module.__dict__)
    return module.routing_stimulus


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bundle", type=Path, default=Path("bundles/H200-vllm-modular-f2"))
    parser.add_argument("--against", default=None, metavar="GIT_REV")
    args = parser.parse_args(argv)
    builders = {"current": stimulus.routing_stimulus}
    if args.against:
        builders[args.against] = older(args.against)
    seconds = dict.fromkeys(builders, 0.0)
    points = differing = 0
    with tempfile.TemporaryDirectory() as scratch:
        for plan in plans(args.bundle, Path(scratch)):
            t = plan["target"]
            target = MoeTarget.for_rank(
                t["tp"], t["dp"], t["rank"], bool(t.get("sequence_parallel", False))
            )
            experts, top_k = plan["global_experts"], plan["global_top_k"]
            geometry = ExpertGeometry.for_target(experts, top_k, target)
            mapping = linear_expert_map(experts, target.ep, target.rank)
            for component, n, a, m in plan["points"]:
                if component != "experts":
                    continue
                points += 1
                seed = n * 1_000_003 + a * 1009 + m
                built = []
                for label, build in builders.items():
                    started = time.process_time()
                    built.append(build(geometry, mapping, n, a, m, seed=seed))
                    seconds[label] += time.process_time() - started
                first = built[0]
                differing += any(
                    not np.array_equal(first.topk_ids, b.topk_ids)
                    or not np.array_equal(first.topk_weights, b.topk_weights)
                    for b in built[1:]
                )
    for label, spent in seconds.items():
        print(f"{label}: {points} expert stimuli in {spent:.2f} CPU s")
    if args.against:
        print(f"differing stimuli: {differing}")
    return 1 if differing else 0


if __name__ == "__main__":
    sys.exit(main())
