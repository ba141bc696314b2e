"""Lookup speed and interpolation error, side by side in one process.

    .venv/bin/python bench/lookup_bench.py [--queries 1000000] [--repeat 5]

Measures, on this machine, as medians over ``--repeat`` runs:
- batch expert lookups on a current-layout table of >= 2,000 N/A/M points;
- scalar lookups, uncached (distinct queries) and cached (repeated queries);
- the same batch and uncached scalar lookups with the locator's exact search alone (the
  walk every query took before the cell candidates), and the build time and memory of the
  deployment's tables;
- the baseline: the historical method in plain per-query Python (bisect over rows, linear
  interpolation), uncached, on the real LLMServingSim bundle;
- open + validate of the real bundle and of the 2,000-point bundle;
- with ``--real BUNDLE:TP:DP:RANK`` (repeatable; ``--real-only`` skips the rest): a shipped
  table's lookup door against the same door with its expert surface swapped for one
  triangulation over every point (before kernel segments): build, batch and uncached scalar
  speed, and the ratios, measured in this process;
- leave-one-out relative error of the expert surface in log and raw coordinates, on the real
  historical eager expert rows and on any bundle given with ``--loo BUNDLE --tp --dp --rank``.

The 2,000-point table is SYNTHETIC: its coordinates follow the acquisition's plan shape (N
geometric by sqrt(2) up to 4,096 gathered rows, Qwen3-30B-A3B's E=128, k=8 at EP2) and its
times come from a formula. It measures lookup speed only; no timing from it is a measurement.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import statistics
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from moetables.bundle import TableSpec, validate_bundle, write_bundle
from moetables.geometry import ExpertGeometry, MoeTarget, linear_expert_map
from moetables.lookup import ComponentTables
from moetables.lookup.balanced import BalancedExpertSurface
from moetables.lookup.surface import ExpertSurface

SHARED = ROOT / "bundles/llmservingsim-rtxpro6000/Qwen/Qwen3-30B-A3B-Instruct-2507/bf16"


def geometric(top: int, factor: float) -> list[int]:
    values, x = {1, top}, 1.0
    while x < top:
        values.add(round(x))
        x *= factor
    return sorted(v for v in values if 1 <= v <= top)


def synthetic_bundle(dest: Path) -> tuple[Path, ExpertGeometry]:
    target = MoeTarget.for_rank(1, 2, 0)
    g = ExpertGeometry.for_target(128, 8, target)
    rows: list[tuple[str, str, int, int, int, float]] = []
    tokens = geometric(4096, math.sqrt(2))
    for n in tokens:
        rows.append(("gate_routing", "eager", n, -1, -1, 5.0 + n * 0.002))
        rows.append(("finalize_copy", "eager", n, -1, -1, 1.0 + n * 0.0005))
        rows.append(("experts", "eager", n, 0, 0, 10.0 + n * 0.01))
        for a in sorted(set(geometric(g.local_experts, math.sqrt(2))) | {g.top_k}):
            low, high = g.assignment_bounds(n, a)
            if low > high:
                continue
            for m in sorted(set(geometric(high, 2.0)) | {low, high, g.balanced_total(n)}):
                if g.feasible(n, a, m):
                    rows.append(("experts", "eager", n, a, m, 20.0 + 3.0 * a + 0.02 * m + 0.01 * n))
    contract = {
        "target": target.as_dict(),
        "global_experts": 128,
        "global_top_k": 8,
        "local_experts": 64,
        "expert_map": linear_expert_map(128, 2, 0),
        "placement": "linear",
        "local_token_budget": 4096,
        "maximum_expert_tokens": 4096,
        "components": ["gate_routing", "experts", "finalize_copy"],
        "modes": ["eager"],
        "expert_conditioning": {"quality_relative_tolerance": 0.03},
        "backend": "synthetic benchmark table: formula times, not measurements",
    }
    coverage = {
        "complete": True,
        "completed_rounds": 1,
        "conditioning_summary": {
            "checked_points": 0,
            "failed_points": 0,
            "max_relative_change": 0.0,
        },
    }
    header = {"hardware": "SYNTHETIC", "model": "bench/synthetic", "variant": "bf16"}
    write_bundle(dest, header, [TableSpec(target, contract, coverage, rows)])
    return dest, g


def random_queries(
    g: ExpertGeometry, count: int, seed: int, top: int = 4096
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    n = np.exp(rng.uniform(0, math.log(top), count)).astype(np.int64).clip(1, top)
    a = (
        np.exp(rng.uniform(0, math.log(g.local_experts), count))
        .astype(np.int64)
        .clip(1, g.local_experts)
    )
    a = np.minimum(a, n * g.top_k)  # A distinct experts need at least ceil(A/k) tokens
    # With fewer than k remote experts each token keeps k - R pairs local (EP1: A >= k).
    a = np.maximum(a, max(1, g.top_k - g.remote_experts))
    low = np.maximum(a, n * max(0, g.top_k - g.remote_experts))
    high = n * np.minimum(g.top_k, a)
    m = np.exp(rng.uniform(np.log(low), np.log(high) + 1e-12)).astype(np.int64).clip(low, high)
    return n, a, m


def median_time(fn: Callable[[], object], repeat: int) -> float:
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def loo(
    tokens: np.ndarray,
    active: np.ndarray,
    pairs: np.ndarray,
    times: np.ndarray,
    g: ExpertGeometry,
    coordinates: str,
) -> dict[str, float]:
    errors = []
    refused = 0
    for i in range(len(tokens)):
        keep = np.arange(len(tokens)) != i
        surface = ExpertSurface(
            tokens[keep],
            active[keep],
            pairs[keep],
            times[keep],
            g,
            label="loo",
            coordinates=coordinates,
        )  # type: ignore[arg-type]
        values, codes = surface.batch(tokens[i : i + 1], active[i : i + 1], pairs[i : i + 1])
        if codes[0] != 0:
            refused += 1  # on the hull: no enclosing simplex without it, and no extrapolation
            continue
        errors.append(abs(values[0] - times[i]) / times[i])
    arr = np.array(errors)
    return {
        "points": len(tokens),
        "answered": len(arr),
        "refused_on_hull": refused,
        "median_rel_error": float(np.median(arr)),
        "p95_rel_error": float(np.percentile(arr, 95)),
        "max_rel_error": float(arr.max()),
    }


def loo_bundle(path: Path, tp: int, dp: int, rank: int) -> dict[str, dict[str, float]]:
    deployment = ComponentTables(path).deployment(tp, dp, rank)
    from moetables.bundle import load_table

    table = load_table(path, deployment.entry)
    rows = (table.component == "experts") & (table.mode == "eager") & (table.activated_experts > 0)
    cols = (
        table.tokens[rows],
        table.activated_experts[rows],
        table.local_assignments[rows],
        table.time_us[rows],
    )
    return {c: loo(*cols, deployment.entry.geometry, c) for c in ("log", "raw")}


def real_table(spec: str, queries: int, repeat: int) -> dict[str, object]:
    """One shipped table (``BUNDLE:TP:DP:RANK``), its lookup door against the same door with
    the expert surface swapped for one triangulation over every point (the lookup before
    kernel segments), in this process: build, batch and uncached scalar speed, and ratios.
    For a table without kernel steps both are the same surface (the ratio is the noise)."""
    root, tp, dp, rank = spec.rsplit(":", 3)
    from moetables.bundle import load_table

    builds, whole_builds = [], []
    for _ in range(repeat):
        start = time.perf_counter()
        door = ComponentTables(Path(root)).deployment(int(tp), int(dp), int(rank))
        builds.append(time.perf_counter() - start)
    table = load_table(door.root, door.entry)
    rows = table.select("experts", "eager")
    cols = (
        table.tokens[rows],
        table.activated_experts[rows],
        table.local_assignments[rows],
        table.time_us[rows],
    )
    g = door.entry.geometry
    for _ in range(repeat):
        start = time.perf_counter()
        whole = ExpertSurface(*cols, g, label="whole")
        whole_builds.append(time.perf_counter() - start)
    segmented = door._experts[("experts", "eager")]
    top = int(cols[0].max())
    n, a, m = random_queries(g, queries, seed=1, top=top)
    count = 20_000
    sn, sa, sm = (x.tolist() for x in random_queries(g, count * repeat, seed=2, top=top))
    out: dict[str, object] = {
        "surface": type(segmented).__name__,
        "expert_rows": int(cols[0].size),
        "segments": len(getattr(segmented, "segments", [])) or 1,
        "deployment_build_s": statistics.median(builds),
        "whole_surface_build_s": statistics.median(whole_builds),
    }
    # Before and after in turn, round by round (A B A B ...), so that drift on a shared
    # machine falls on both alike; each figure is the median of its rounds.
    surfaces = (("before", whole), ("after", segmented))
    batch: dict[str, list[float]] = {"before": [], "after": []}
    scalar: dict[str, list[float]] = {"before": [], "after": []}
    for name, surface in surfaces:
        door._experts[("experts", "eager")] = surface  # type: ignore[assignment]
        door.batch("experts", n[:1000], a[:1000], m[:1000])
        answered = door.batch("experts", n, a, m).code == 0
        out[f"batch_answered_share_{name}"] = float(answered.mean())
    for r in range(repeat):
        for name, surface in surfaces:
            door._experts[("experts", "eager")] = surface  # type: ignore[assignment]
            start = time.perf_counter()
            door.batch("experts", n, a, m)
            batch[name].append(time.perf_counter() - start)
            door.time_us.cache_clear()
            lookup = door.time_us
            start = time.perf_counter()
            for i in range(r * count, (r + 1) * count):
                try:
                    lookup("experts", sn[i], sa[i], sm[i])
                except (LookupError, ValueError):
                    pass
            scalar[name].append(time.perf_counter() - start)
    for name, _ in surfaces:
        out[f"batch_queries_per_s_{name}"] = queries / statistics.median(batch[name])
        out[f"scalar_uncached_queries_per_s_{name}"] = count / statistics.median(scalar[name])
    ratios = [b / a_ for a_, b in zip(batch["after"], batch["before"], strict=True)]
    out["batch_after_over_before_per_round"] = ratios
    door._experts[("experts", "eager")] = segmented
    for key in ("batch_queries_per_s", "scalar_uncached_queries_per_s"):
        out[f"{key}_after_over_before"] = out[f"{key}_after"] / out[f"{key}_before"]  # type: ignore[operator]
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--queries", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--loo", type=Path, action="append", default=[])
    parser.add_argument("--tp", type=int, default=1)
    parser.add_argument("--dp", type=int, default=2)
    parser.add_argument("--rank", type=int, default=0)
    parser.add_argument(
        "--real",
        action="append",
        default=[],
        help="BUNDLE:TP:DP:RANK of a shipped table: its door against one whole triangulation",
    )
    parser.add_argument("--real-only", action="store_true", help="only the --real tables")
    args = parser.parse_args()
    results: dict[str, object] = {}
    for spec in args.real:
        results[f"real {spec}"] = real_table(spec, args.queries, args.repeat)
    if args.real_only:
        print(json.dumps(results, indent=2))
        return
    work = Path(tempfile.mkdtemp())
    try:
        path, g = synthetic_bundle(work / "synthetic")
        report = validate_bundle(path)
        assert report.ok, report.problems
        points = int(sum((t.component == "experts").sum() for t in report.tables.values()))
        results["table_expert_points"] = points

        builds = []
        for _ in range(args.repeat):
            start = time.perf_counter()
            deployment = ComponentTables(path).deployment(1, 2, 0)
            builds.append(time.perf_counter() - start)
        results["surface_build_s"] = statistics.median(builds)
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        kept = ComponentTables(path).deployment(1, 2, 0)
        results["deployment_memory_mb"] = (tracemalloc.get_traced_memory()[0] - before) / 2**20
        tracemalloc.stop()
        del kept
        surface = deployment._experts[("experts", "eager")]
        assert isinstance(surface, ExpertSurface) and surface._locator is not None
        locator = surface._locator
        results["locator_cells"] = locator.cell_count
        results["locator_cells_per_axis"] = locator.cells_per_axis
        results["locator_candidates"] = len(locator.cell_candidates)

        n, a, m = random_queries(g, args.queries, seed=1)
        deployment.batch("experts", n[:1000], a[:1000], m[:1000])
        batch_s = median_time(lambda: deployment.batch("experts", n, a, m), args.repeat)
        answered = float((deployment.batch("experts", n, a, m).code == 0).mean())
        results["batch_queries_per_s"] = args.queries / batch_s
        results["batch_answered_share"] = answered
        # The same lookups with the locator's exact search alone (the walk every query took
        # before the cell candidates), for a ratio measured in this process.
        locator.search = locator.search_by_walk  # type: ignore[method-assign]
        walk_s = median_time(lambda: deployment.batch("experts", n, a, m), args.repeat)
        del locator.search
        results["batch_queries_per_s_exact_walk"] = args.queries / walk_s

        count = 20_000
        sn, sa, sm = (x.tolist() for x in random_queries(g, count * args.repeat, seed=2))

        def scalar(offset: int) -> None:
            lookup = deployment.time_us
            for i in range(offset, offset + count):
                try:
                    lookup("experts", sn[i], sa[i], sm[i])
                except (LookupError, ValueError):
                    pass

        def uncached() -> float:
            runs = []
            for r in range(args.repeat):
                deployment.time_us.cache_clear()
                start = time.perf_counter()
                scalar(r * count)
                runs.append(time.perf_counter() - start)
            return count / statistics.median(runs)

        results["scalar_uncached_queries_per_s"] = uncached()
        walk_one = locator.locate_one_by_walk
        locator.locate_one_3d = lambda y0, y1, y2: walk_one((y0, y1, y2))  # type: ignore[method-assign]
        results["scalar_uncached_queries_per_s_exact_walk"] = uncached()
        del locator.locate_one_3d
        hot = [(sn[i], sa[i], sm[i]) for i in range(1000)]
        for q in hot:
            try:
                deployment.time_us("experts", *q)
            except (LookupError, ValueError):
                pass
        reps = 200

        def cached() -> None:
            lookup = deployment.time_us
            for _ in range(reps):
                for q0, q1, q2 in hot:
                    try:
                        lookup("experts", q0, q1, q2)
                    except (LookupError, ValueError):
                        pass

        results["scalar_cached_queries_per_s"] = reps * len(hot) / median_time(cached, args.repeat)

        # Baseline: the historical method, per query in plain Python, no cache, real bundle.
        real = ComponentTables(SHARED).deployment(1, 2, 0)
        surface = real._experts[("experts", "eager")]
        assert isinstance(surface, BalancedExpertSurface)
        geo = real.entry.geometry
        rng = np.random.default_rng(3)
        bn = rng.integers(1, 4097, 20_000).tolist()
        ba = [
            int(rng.integers(-(-geo.balanced_total(x) // x), min(64, geo.balanced_total(x)) + 1))
            for x in bn
        ]
        bm = [geo.balanced_total(x) for x in bn]

        def baseline() -> None:
            for x, y, z in zip(bn, ba, bm, strict=True):
                try:
                    surface.time(x, y, z)
                except (LookupError, ValueError):
                    pass

        results["baseline_historical_per_query_per_s"] = len(bn) / median_time(
            baseline, args.repeat
        )
        results["open_validate_shared_ms"] = 1e3 * median_time(
            lambda: validate_bundle(SHARED), args.repeat
        )
        results["open_validate_synthetic_ms"] = 1e3 * median_time(
            lambda: validate_bundle(path), args.repeat
        )
        for key in (
            "batch_queries_per_s",
            "scalar_uncached_queries_per_s",
            "scalar_cached_queries_per_s",
        ):
            results[f"{key}_over_baseline"] = (
                results[key] / results["baseline_historical_per_query_per_s"]
            )  # type: ignore[operator]
        for key in ("batch_queries_per_s", "scalar_uncached_queries_per_s"):
            results[f"{key}_over_exact_walk"] = results[key] / results[f"{key}_exact_walk"]  # type: ignore[operator]

        hist = ComponentTables(SHARED).bundle
        from moetables.bundle import load_table

        for entry in hist.entries[:1]:
            table = load_table(SHARED, entry)
            rows = (
                (table.component == "experts")
                & (table.mode == "eager")
                & (table.activated_experts > 0)
            )
            cols = (
                table.tokens[rows],
                table.activated_experts[rows],
                table.local_assignments[rows],
                table.time_us[rows],
            )
            results["loo_llmservingsim_rtxpro6000_eager_rank0"] = {
                c: loo(*cols, entry.geometry, c) for c in ("log", "raw")
            }
        for extra in args.loo:
            results[f"loo_{extra}"] = loo_bundle(extra, args.tp, args.dp, args.rank)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
