"""Two locators side by side in one process: the package's and another file's (an A/B test).

    git show 14a813f:moetables/lookup/locate.py > /tmp/locate_before.py
    PYTHONPATH=. .venv/bin/python bench/locate_ab.py --other /tmp/locate_before.py

The other file must define ``SimplexLocator`` with the same interface (for instance the
single-module locator before the split into ``moetables/lookup/locate/``). Both serve the
2,000-point SYNTHETIC table of bench/lookup_bench.py (speed only), through the same deployment
code; their timings alternate, round after round, so both see the same load on a shared
machine, and the figure that counts is the median of the per-round ratios. Answers are
compared bit for bit.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from lookup_bench import random_queries, synthetic_bundle  # the lookup figures' table

import moetables.lookup.surface as surface_module
from moetables.lookup import ComponentTables


def _load(path: Path) -> Any:
    spec = importlib.util.spec_from_file_location("locate_other", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _seconds(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--other", type=Path, required=True)
    parser.add_argument("--queries", type=int, default=100_000)
    parser.add_argument("--scalar", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=31)
    args = parser.parse_args()
    other = _load(args.other)
    with tempfile.TemporaryDirectory() as tmp:
        path, g = synthetic_bundle(Path(tmp) / "synthetic")
        here = ComponentTables(path).deployment(1, 2, 0)
        saved = surface_module.SimplexLocator
        surface_module.SimplexLocator = other.SimplexLocator  # type: ignore[misc]
        try:
            there = ComponentTables(path).deployment(1, 2, 0)
        finally:
            surface_module.SimplexLocator = saved  # type: ignore[misc]
    for deployment, cls in ((here, saved), (there, other.SimplexLocator)):
        assert type(deployment._experts[("experts", "eager")]._locator) is cls
    n, a, m = random_queries(g, args.queries, seed=1)
    # Distinct scalar queries for every round (the deployment caches answers): round r asks
    # both sides the same slice, uncached on each.
    total = args.scalar * (args.rounds + 1)
    sn, sa, sm = (x.tolist() for x in random_queries(g, total, seed=2))

    def scalar(deployment: Any, r: int) -> Callable[[], list[Any]]:
        def run() -> list[Any]:
            out = []
            lookup = deployment.time_us
            for i in range(r * args.scalar, (r + 1) * args.scalar):
                try:
                    out.append(lookup("experts", sn[i], sa[i], sm[i]))
                except (LookupError, ValueError) as exc:
                    out.append(type(exc).__name__)
            return out

        return run

    mine, theirs = here.batch("experts", n, a, m), there.batch("experts", n, a, m)
    identical_batch = bool(
        np.array_equal(mine.code, theirs.code)
        and mine.time_us.tobytes() == theirs.time_us.tobytes()
    )
    identical_scalar = scalar(here, args.rounds)() == scalar(there, args.rounds)()
    ratios: dict[str, list[float]] = {"batch": [], "scalar": []}
    rates: dict[str, list[float]] = {
        k: [] for k in ("batch_here", "batch_other", "scalar_here", "scalar_other")
    }
    for r in range(args.rounds):
        order = [(here, "here"), (there, "other")]
        if r % 2:
            order.reverse()  # neither side always runs first
        got: dict[str, float] = {}
        for deployment, side in order:
            got[f"batch_{side}"] = args.queries / _seconds(
                lambda d=deployment: d.batch("experts", n, a, m)
            )
            got[f"scalar_{side}"] = args.scalar / _seconds(scalar(deployment, r))
        for key, value in got.items():
            rates[key].append(value)
        ratios["batch"].append(got["batch_here"] / got["batch_other"])
        ratios["scalar"].append(got["scalar_here"] / got["scalar_other"])
    print(
        json.dumps(
            {
                "queries": args.queries,
                "scalar_queries": args.scalar,
                "rounds": args.rounds,
                "identical_batch_answers": identical_batch,
                "identical_scalar_answers": identical_scalar,
                **{f"{k}_per_s_median": statistics.median(v) for k, v in rates.items()},
                "batch_here_over_other_median": statistics.median(ratios["batch"]),
                "scalar_here_over_other_median": statistics.median(ratios["scalar"]),
                "batch_ratio_range": [min(ratios["batch"]), max(ratios["batch"])],
                "scalar_ratio_range": [min(ratios["scalar"]), max(ratios["scalar"])],
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
