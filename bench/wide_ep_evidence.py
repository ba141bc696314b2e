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
  point by point, each rank against rank 0, per component (median and max relative difference).
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import sys
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


def agreement(bundle: Path, dp: int) -> dict[str, dict[str, Any]]:
    """Each rank against rank 0, point by point on their common keys, per component."""
    base = rank_rows(bundle, dp, 0)
    out: dict[str, dict[str, Any]] = {}
    for rank in range(1, dp):
        other = rank_rows(bundle, dp, rank)
        per: dict[str, Any] = {"common_points": len(base.keys() & other.keys())}
        per["only_rank0"] = len(base.keys() - other.keys())
        per["only_this_rank"] = len(other.keys() - base.keys())
        for component in ("gate_routing", "experts", "finalize_copy"):
            diffs = [
                abs(other[k] - base[k]) / base[k]
                for k in base.keys() & other.keys()
                if k[0] == component
            ]
            worst = max(
                (k for k in base.keys() & other.keys() if k[0] == component),
                key=lambda k: abs(other[k] - base[k]) / base[k],
            )
            per[component] = {
                "points": len(diffs),
                "median_rel_diff": statistics.median(diffs),
                "max_rel_diff": max(diffs),
                "max_at": list(worst[2:]),
                "within_3pct": sum(d <= 0.03 for d in diffs) / len(diffs),
            }
        out[f"rank{rank}_vs_rank0"] = per
    return out


def evidence() -> dict[str, Any]:
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
                "loo": loo_bundle(bundle, 1, dp, rank),
            }
        results[f"dp{dp}"] = {"ranks": ranks, "agreement": agreement(bundle, dp)}
    return results


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    results = evidence()
    text = json.dumps(results, indent=1, sort_keys=True)
    if args.json:
        args.json.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
