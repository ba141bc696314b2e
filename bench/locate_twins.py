"""Do the locator's 3-D twins earn their place? Each against the general path, same queries.

    PYTHONPATH=. .venv/bin/python bench/locate_twins.py [--queries 20000] [--repeat 5]

On the 2,000-point SYNTHETIC table of bench/lookup_bench.py (coordinates shaped like the
acquisition's plan; it measures speed only), as medians over ``--repeat`` runs:

- ``locate_one`` (3-D: the unrolled ``locate_one_3d``) against ``locate_one_nd`` (the same
  search written for any dimension), one distinct query at a time;
- ``locate_one_by_walk`` (3-D: the unrolled ``_walk_one_3d``) against ``walk_one_nd``;

and how far the twins' answers lie from the general ones (their float order differs, so
bit-identity of the published answers needs the twin that fixed them).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from lookup_bench import random_queries, synthetic_bundle  # the lookup figures' table

from moetables.lookup import ComponentTables
from moetables.lookup.surface import ExpertSurface

Answer = tuple[tuple[int, ...], tuple[float, ...]] | None


def _rate(
    call: Callable[[Sequence[float]], Answer], points: list[tuple[float, ...]], repeat: int
) -> float:
    rates = []
    for _ in range(repeat):
        start = time.perf_counter()
        for p in points:
            call(p)
        rates.append(len(points) / (time.perf_counter() - start))
    return statistics.median(rates)


def _largest_gap(a: list[Answer], b: list[Answer]) -> float:
    gap = 0.0
    for x, y in zip(a, b, strict=True):
        if (x is None) != (y is None):
            return float("inf")
        if x is not None and y is not None:
            if x[0] != y[0]:
                return float("inf")
            gap = max(gap, max(abs(u - v) for u, v in zip(x[1], y[1], strict=True)))
    return gap


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--queries", type=int, default=20_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        bundle, geometry = synthetic_bundle(Path(tmp) / "synthetic")
        surface: Any = ComponentTables(bundle).deployment(1, 2, 0)._experts[("experts", "eager")]
    assert isinstance(surface, ExpertSurface) and surface._locator is not None
    locator = surface._locator
    assert locator.dim == 3
    n, a, m = random_queries(geometry, args.queries, seed=2)
    points = [(float(x), float(y), float(z)) for x, y, z in zip(n, a, m, strict=True)]
    unit = [
        tuple(locator._unit([np.array([c]) for c in p])[k][0] for k in range(3)) for p in points
    ]
    walk_3d: Callable[[Sequence[float]], Answer] = lambda x: locator._walk_one(x, 0)  # noqa: E731
    walk_nd: Callable[[Sequence[float]], Answer] = lambda x: locator.walk_one_nd(x, 0)  # noqa: E731
    result = {
        "queries": args.queries,
        "locate_one_3d_per_s": _rate(locator.locate_one, points, args.repeat),
        "locate_one_nd_per_s": _rate(locator.locate_one_nd, points, args.repeat),
        "walk_one_3d_per_s": _rate(walk_3d, unit, args.repeat),
        "walk_one_nd_per_s": _rate(walk_nd, unit, args.repeat),
        "locate_one_largest_weight_gap": _largest_gap(
            [locator.locate_one(p) for p in points], [locator.locate_one_nd(p) for p in points]
        ),
        "walk_one_largest_weight_gap": _largest_gap(
            [walk_3d(x) for x in unit], [walk_nd(x) for x in unit]
        ),
    }
    result["locate_one_3d_speedup"] = result["locate_one_3d_per_s"] / result["locate_one_nd_per_s"]
    result["walk_one_3d_speedup"] = result["walk_one_3d_per_s"] / result["walk_one_nd_per_s"]
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
