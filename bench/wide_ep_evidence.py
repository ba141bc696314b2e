"""Evidence of the shipped wide-EP H200 bundles (issue 20, item 3): TP1/DP4/EP4 and TP1/DP8/EP8.

    PYTHONPATH=. .venv/bin/python bench/wide_ep_evidence.py [--json OUT.json]

Per bundle and rank, from the shipped files only (no device):
- points and the B/2B check (``stability.csv``): expert points checked, how many passed at their
  first attempt, how many needed a later attempt, how many were never published, and the
  largest published relative change;
- leave-one-out error of the expert surface in raw and log coordinates (``bench/lookup_bench.py``'s
  ``loo_bundle``, the same function the factor-2 bundles were measured with);
- whether ranks with identical local geometry agree: every rank of a linear placement holds
  E/EP experts of the same shapes, so its tables are, by the contract, the same function of
  (N, A, M); the ranks were all measured (none shares another's rows), and this compares them
  point by point, each rank against rank 0, per component (median and max relative difference);
- the signed expert difference of each rank against rank 0 by band of N (``order``), and, for
  DP8, the points the resumed process measured (a fresh process, seconds after the first was
  stopped) against the same rank's points of the first process (``resumed``), from the samples
  archive beside the bundle: whether a difference follows the rank or the measurement order.

``--skip-loo`` keeps the leave-one-out numbers of an existing ``--json`` file (they take about
ten minutes on two shared cores) and recomputes the rest.
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import sys
import tarfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from lookup_bench import loo_bundle

from moetables.lookup import ComponentTables

MODEL = "Qwen/Qwen3-30B-A3B-Instruct-2507/bf16"
BUNDLES = {
    4: ROOT / "bundles/H200-vllm-modular-dp4-f4" / MODEL,
    8: ROOT / "bundles/H200-vllm-modular-dp8-f4" / MODEL,
}
Key = tuple[str, str, int, int, int]


def _table_path(bundle: Path, dp: int, rank: int, name: str) -> Path:
    return bundle / "tp1/moe_components" / f"dp{dp}_ep{dp}_rank{rank}_sp0" / name


def rank_rows(bundle: Path, dp: int, rank: int) -> dict[Key, float]:
    """The table's rows by (component, mode, N, A, M), time in us."""
    with _table_path(bundle, dp, rank, "components.csv").open(newline="") as f:
        return {
            (
                r["component"],
                r["mode"],
                int(r["tokens"]),
                int(r["activated_experts"]),
                int(r["local_assignments"]),
            ): float(r["time_us"])
            for r in csv.DictReader(f)
        }


def stability(bundle: Path, dp: int, rank: int) -> dict[str, Any]:
    """B/2B controls of one rank: first-attempt passes, later passes, failures, largest change."""
    with _table_path(bundle, dp, rank, "stability.csv").open(newline="") as f:
        rows = list(csv.DictReader(f))
    by_point: dict[tuple[str, str, str], list[dict[str, str]]] = {}
    for r in rows:
        key = (r["tokens"], r["activated_experts"], r["local_assignments"])
        by_point.setdefault(key, []).append(r)
    first, later, never = 0, 0, 0
    published_changes: list[float] = []
    for attempts in by_point.values():
        published = [a for a in attempts if a["published"] == "1"]
        if not published:
            never += 1
            continue
        published_changes.append(float(published[0]["relative_change"]))
        if min(int(a["attempt"]) for a in published) == 0 and len(attempts) == 1:
            first += 1
        else:
            later += 1
    return {
        "checked_points": len(by_point),
        "controls": len(rows),
        "passed_first_attempt": first,
        "passed_later_attempt": later,
        "never_passed": never,
        "max_published_change": max(published_changes),
    }


def compare_rows(base: dict[Key, float], other: dict[Key, float]) -> dict[str, Any]:
    """``other`` against ``base``, point by point on their common keys, per component."""
    per: dict[str, Any] = {"common_points": len(base.keys() & other.keys())}
    per["only_rank0"] = len(base.keys() - other.keys())
    per["only_this_rank"] = len(other.keys() - base.keys())
    for component in ("gate_routing", "experts", "finalize_copy"):
        common = [k for k in base.keys() & other.keys() if k[0] == component]
        if not common:
            continue
        diffs = [abs(other[k] - base[k]) / base[k] for k in common]
        worst = max(common, key=lambda k: abs(other[k] - base[k]) / base[k])
        per[component] = {
            "points": len(diffs),
            "median_rel_diff": statistics.median(diffs),
            "max_rel_diff": max(diffs),
            "max_at": list(worst[2:]),
            "within_3pct": sum(d <= 0.03 for d in diffs) / len(diffs),
        }
    return per


def agreement(
    bundle: Path, dp: int, ranks: Iterable[int] | None = None
) -> dict[str, dict[str, Any]]:
    """Each rank (default: 1..dp-1) against rank 0, point by point on their common keys, per
    component (``compare_rows``)."""
    base = rank_rows(bundle, dp, 0)
    return {
        f"rank{rank}_vs_rank0": compare_rows(base, rank_rows(bundle, dp, rank))
        for rank in (range(1, dp) if ranks is None else ranks)
    }


BANDS = ((1, 64), (65, 512), (513, 1 << 20))


def signed_bands(base: dict[Key, float], other: dict[Key, float]) -> dict[str, float]:
    """Signed median of (other / base - 1) over common expert rows with A > 0, per band of N
    (a band without such rows is left out)."""
    out: dict[str, float] = {}
    for lo, hi in BANDS:
        ratios = [
            other[k] / base[k] - 1
            for k in base
            if k in other and k[0] == "experts" and k[3] > 0 and lo <= k[2] <= hi
        ]
        if ratios:
            out[f"N{lo}-{hi}"] = statistics.median(ratios)
    return out


def order(bundle: Path, dp: int, ranks: Iterable[int] | None = None) -> dict[str, dict[str, float]]:
    """Signed median of (rank / rank 0 - 1) over expert rows with A > 0, per band of N."""
    base = rank_rows(bundle, dp, 0)
    return {
        f"rank{rank}": signed_bands(base, rank_rows(bundle, dp, rank))
        for rank in (range(1, dp) if ranks is None else ranks)
    }


def _resumed_process(bundle: Path) -> tuple[float, dict[int, set[Key]]]:
    """When the last process started (the last phase record's ``process_started_at``), and the
    rows each rank measured after that, from the samples archive beside the bundle."""
    archive = bundle.parent / "bf16.acquisition-samples.tar.gz"
    late: dict[int, set[Key]] = {}
    with tarfile.open(archive) as tar:
        phases = tar.extractfile("phases.jsonl")
        assert phases is not None
        started = float(json.loads(phases.read().splitlines()[-1])["process_started_at"])
        for member in tar.getmembers():
            if not member.name.endswith("samples.jsonl"):
                continue
            rank = int(member.name.split("_rank")[1].split("_")[0])
            f = tar.extractfile(member)
            assert f is not None
            for line in f:
                if b'"type": "point"' not in line:
                    continue
                record = json.loads(line)
                if record["at"] > started and record["status"] == "measured":
                    c, n, a, m = record["point"].split(":")
                    late.setdefault(rank, set()).add((c, "eager", int(n), int(a), int(m)))
    return started, late


def resumed_keys(bundle: Path) -> dict[int, set[Key]]:
    """Per rank, the rows measured by the resumed (last) process."""
    return _resumed_process(bundle)[1]


def resumed(bundle: Path, dp: int) -> dict[str, Any]:
    """Rows measured by the resumed process against rank 0, and the same rank's rows of the
    first process in the same N range."""
    started, late = _resumed_process(bundle)
    base = rank_rows(bundle, dp, 0)
    out: dict[str, Any] = {"process_started_at": started}
    for rank, keys in sorted(late.items()):
        other = rank_rows(bundle, dp, rank)
        lo, hi = min(k[2] for k in keys), max(k[2] for k in keys)
        earlier = [
            k
            for k in other
            if k not in keys and k[0] == "experts" and k[3] > 0 and lo <= k[2] <= hi
        ]
        out[f"rank{rank}"] = {
            "resumed_points": len(keys),
            "N_range": [lo, hi],
            "resumed_median_vs_rank0": statistics.median(other[k] / base[k] - 1 for k in keys),
            "first_process_points": len(earlier),
            "first_process_median_vs_rank0": (
                statistics.median(other[k] / base[k] - 1 for k in earlier) if earlier else None
            ),
        }
    return out


def evidence(previous: dict[str, Any] | None = None) -> dict[str, Any]:
    results: dict[str, Any] = {}
    for dp, bundle in BUNDLES.items():
        tables = ComponentTables(bundle)
        ranks: dict[str, Any] = {}
        for rank in range(dp):
            rows = rank_rows(bundle, dp, rank)
            per_component: dict[str, int] = {}
            for k in rows:
                per_component[k[0]] = per_component.get(k[0], 0) + 1
            ranks[f"rank{rank}"] = {
                "points": len(rows),
                "per_component": per_component,
                "local_experts": tables.deployment(1, dp, rank).entry.geometry.local_experts,
                "stability": stability(bundle, dp, rank),
                "loo": (
                    previous[f"dp{dp}"]["ranks"][f"rank{rank}"]["loo"]
                    if previous
                    else loo_bundle(bundle, 1, dp, rank)
                ),
            }
        results[f"dp{dp}"] = {
            "ranks": ranks,
            "agreement": agreement(bundle, dp),
            "order": order(bundle, dp),
        }
        if dp == 8:
            results[f"dp{dp}"]["resumed"] = resumed(bundle, dp)
    return results


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--json", type=Path)
    parser.add_argument("--skip-loo", action="store_true")
    args = parser.parse_args()
    previous = json.loads(args.json.read_text()) if args.skip_loo and args.json else None
    results = evidence(previous)
    text = json.dumps(results, indent=1, sort_keys=True)
    if args.json:
        args.json.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
