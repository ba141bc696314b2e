"""Leave-one-out of the kernel-step tables, read against the Triton kernel's configuration
segments, and whether the lookup itself interpolates across a configuration switch (issue 20,
item 1; docs/benchmarks.md, "The kernel-step tables, measured").

    PYTHONPATH=. .venv/bin/python bench/kernel_step_loo.py --bundle B [--bundle B2 ...] \
        [--json out.json] [--classes v2|v3|v4]

``--classes`` reads the points' classes (which points are bends) under another kernel-step
rule than the one the table's contract records, to compare tables of two rules on one footing
(e.g. a v3 table read with v4's classes against a v4 table); the default is the table's own.

A kernel segment is a run of rows N that vLLM 0.26.0's `TritonExperts` serves with one
configuration (`acquisition.plan.kernel.KernelSteps.kernel`: the tuned file's nearest key, or
`get_default_config`'s branch). The kernel-step plan measures N = t and t + 1 at every switch
between t and t + 1, so no integer N lies between two points on either side of a switch.

Per table this prints:

1. The plain leave-one-out (the lookups' own `ExpertSurface` over every other point, as
   `bench/loo_surfaces.py` does), split by where the point sits: `switch` (its N is t or t + 1 of
   a switch: removed, it can only be answered across the switch, which a query there never is:
   the point is measured), `corner` (a corner of the balanced row tiles in M or at EP1 in N,
   `is_knot`), and the rest, split again by whether the simplex that answered the removed point
   has every vertex on the point's own segment (`inside`) or not (`crossing`). Also the plain
   leave-one-out restricted to the points whose nearest measured N below and above (same A)
   run the point's configuration.
   Then the same leave-one-out with the lookup's segment-aware surface
   (`moetables.lookup.segments.SegmentedExpertSurface`, what `DeploymentTables` answers a
   kernel-step table with), by the same classes.
2. The lookup on the full table at every integer N of its support and a fixed set of (A, M)
   (the balanced M = N k / EP at each A that is feasible): how many answers come from a simplex
   with a vertex on another segment, and by how much such an answer differs from the same query
   answered from the points of its own segment only (what a segment-aware lookup would answer);
   then the segment-aware lookup itself (`DeploymentTables.batch`) on every one of those
   queries against its own segment's answer: equal bit for bit, both refused, or different.

A segment is a run of N served by one kernel (the kernel of N = 5..6 at DP1 recurs on 29..40:
two segments; the first version of this script keyed segments by kernel and merged them).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from acquisition.plan.kernel import (
    KERNEL_STEPS_RULE,
    KERNEL_STEPS_RULE_V3,
    KERNEL_STEPS_RULE_V4,
    KernelSteps,
)
from bench.loo_surfaces import PointError, is_knot, kernel_steps
from moetables.bundle import Bundle, TableEntry, load_table, open_bundle
from moetables.lookup import ComponentTables
from moetables.lookup.segments import SegmentedExpertSurface
from moetables.lookup.surface import ExpertSurface

IntArray = np.ndarray


def _vertices(surface: ExpertSurface, n: float, a: float, m: float) -> list[int] | None:
    """Indices (into the surface's positive points) of the simplex that answers (n, a, m) with
    a positive weight, read as `moetables.lookup.explain` reads it; None if not located."""
    locator = surface._locator
    if locator is None:
        return None
    c = [x - surface._mean_py[j] for j, x in enumerate((n, a, m))]
    y = (
        tuple(c)
        if surface._full
        else tuple(sum(r[j] * c[j] for j in range(3)) for r in surface._basis_py)
    )
    located = locator.locate_one(y)
    if located is None:
        return None
    # A query on a simplex's face has zero weight on the opposite vertex, up to rounding: such a
    # vertex contributes nothing and is not counted as used.
    return [int(v) for v, w in zip(located[0], located[1], strict=True) if w > 1e-9]


@dataclass
class Loo:
    target: str
    source: str
    points: int
    classes: dict[str, list[float]] = field(default_factory=dict)
    same_neighbours: list[float] = field(default_factory=list)
    worst: list[tuple[float, int, int, int, str]] = field(default_factory=list)
    # The lookup's own segment-aware answer (`SegmentedExpertSurface`) of each removed point,
    # by the same classes.
    segmented: dict[str, list[float]] = field(default_factory=dict)

    def all(self) -> list[float]:
        return [e for v in self.classes.values() for e in v]


def _stats(x: Iterable[float]) -> dict[str, float | int]:
    v = np.asarray(list(x), dtype=float)
    if v.size == 0:
        return {"answered": 0}
    return {
        "answered": int(v.size),
        "median": float(np.median(v)),
        "p95": float(np.percentile(v, 95)),
        "max": float(v.max()),
    }


def _positive(bundle: Bundle, entry: TableEntry) -> tuple[IntArray, IntArray, IntArray, np.ndarray]:
    table = load_table(bundle.root, entry)
    rows = (table.component == "experts") & (table.mode == "eager") & (table.activated_experts > 0)
    return (
        table.tokens[rows],
        table.activated_experts[rows],
        table.local_assignments[rows],
        table.time_us[rows],
    )


@dataclass
class _RunIndex:
    """N -> its run of one kernel (runs past the table's largest N: the last run's)."""

    run: np.ndarray

    def get(self, tokens: int) -> int:
        return int(self.run[min(tokens, len(self.run) - 1)])


def _door(bundle: Bundle, entry: TableEntry) -> Any:
    """The table's lookup door (`ComponentTables`), as a client opens it."""
    t = entry.target
    return ComponentTables(bundle).deployment(t.tp, t.dp, t.rank, t.sequence_parallel)


def _switch(steps: KernelSteps, n: int) -> bool:
    here = steps.kernel(n)
    return steps.kernel(max(1, n - 1)) != here or steps.kernel(n + 1) != here


CLASS_RULES = {"v2": KERNEL_STEPS_RULE, "v3": KERNEL_STEPS_RULE_V3, "v4": KERNEL_STEPS_RULE_V4}


def leave_one_out(bundle: Bundle, entry: TableEntry, worst: int, classes: str | None = None) -> Loo:
    """``classes``: a rule name of `CLASS_RULES` whose bends classify the points (switch rows
    are every rule's); None: the rule the table's contract records."""
    n, a, m, t = _positive(bundle, entry)
    steps = kernel_steps(entry)
    if classes is not None:
        steps = replace(steps, rule=CLASS_RULES[classes])
    run = np.zeros(int(n.max()) + 2, dtype=np.int64)  # runs of one kernel, as below
    for x in range(2, int(n.max()) + 2):
        run[x] = run[x - 1] + (steps.kernel(x) != steps.kernel(x - 1))
    segment = run[n]
    out = Loo(entry.target.deployment, steps.source, len(n))
    for name in ("switch", "corner", "inside", "crossing"):
        out.classes[name] = []
        out.segmented[name] = []
    switches = _door(bundle, entry).kernel_switches
    assert switches is not None, "a kernel-step table"
    door_segment = np.searchsorted(
        np.asarray(switches.switches(int(n.max())), dtype=np.int64), n, side="left"
    )
    for i in range(len(n)):
        keep = np.arange(len(n)) != i
        surface = ExpertSurface(
            n[keep], a[keep], m[keep], t[keep], entry.geometry, label="loo", coordinates="raw"
        )
        values, codes = surface.batch(n[i : i + 1], a[i : i + 1], m[i : i + 1])
        if codes[0] != 0:
            continue  # a hull point, removed: refused, never extrapolated
        err = abs(float(values[0]) - float(t[i])) / float(t[i])
        point = PointError(int(n[i]), int(a[i]), int(m[i]), float(t[i]), float(values[0]))
        if _switch(steps, int(n[i])):
            cls = "switch"
        elif is_knot(point, steps):
            cls = "corner"
        else:
            used = _vertices(surface, float(n[i]), float(a[i]), float(m[i]))
            kept_segment = segment[keep]
            cross = used is not None and any(kept_segment[v] != segment[i] for v in used)
            cls = "crossing" if cross else "inside"
        out.classes[cls].append(err)
        # Segment-aware: the lookup over the other points of the point's segment (a query is
        # answered from its own segment only, so the other segments do not change it).
        mine = (np.arange(len(n)) != i) & (door_segment == door_segment[i])
        if mine.any():
            seg = SegmentedExpertSurface(
                n[mine], a[mine], m[mine], t[mine], entry.geometry, switches, label="loo"
            )
            v, c = seg.batch(n[i : i + 1], a[i : i + 1], m[i : i + 1])
            if c[0] == 0:
                out.segmented[cls].append(abs(float(v[0]) - float(t[i])) / float(t[i]))
        ns = sorted({int(x) for x in n[keep & (a == a[i])]})
        below = [x for x in ns if x < n[i]]
        above = [x for x in ns if x > n[i]]
        if below and above:
            here = steps.kernel(int(n[i]))
            if steps.kernel(below[-1]) == here and steps.kernel(above[0]) == here:
                out.same_neighbours.append(err)
        out.worst.append((err, int(n[i]), int(a[i]), int(m[i]), cls))
    out.worst = sorted(out.worst, reverse=True)[:worst]
    return out


def _own_surface(
    cache: dict[int, ExpertSurface | None],
    own: int | None,
    seg: np.ndarray,
    n: IntArray,
    a: IntArray,
    m: IntArray,
    t: np.ndarray,
    g: Any,
) -> ExpertSurface | None:
    """The surface of the points of segment ``own`` only (built here, apart from the lookup)."""
    if own is None:
        return None
    if own not in cache:
        mask = seg == own
        try:
            cache[own] = ExpertSurface(
                n[mask], a[mask], m[mask], t[mask], g, label="seg", coordinates="raw"
            )
        except Exception:  # a segment too small to triangulate
            cache[own] = None
    return cache[own]


def lookup_crossings(bundle: Bundle, entry: TableEntry) -> dict[str, Any]:
    """Queries at every integer N of the support and each A of the table: how many are answered
    across a configuration switch, and how far from their own segment's answer."""
    n, a, m, t = _positive(bundle, entry)
    steps = kernel_steps(entry)
    g = entry.geometry
    full = ExpertSurface(n, a, m, t, g, label="full", coordinates="raw")
    # A segment is a run of N with one kernel, walked here from the planner's rule (apart from
    # the lookup's segmentation). Not every N of one kernel: at DP1 the kernel of N 5..6 recurs
    # on N 29..40; the first version of this script merged such runs (docs/benchmarks.md).
    run = np.zeros(int(n.max()) + 2, dtype=np.int64)
    for x in range(2, int(n.max()) + 2):
        run[x] = run[x - 1] + (steps.kernel(x) != steps.kernel(x - 1))
    seg = run[n]
    segment_of = _RunIndex(run)
    per_segment: dict[int, ExpertSurface | None] = {}
    actives = sorted({int(x) for x in a})
    queries: list[tuple[int, int, int]] = []
    router: set[tuple[int, int, int]] = set()
    for tokens in range(int(n.min()), int(n.max()) + 1):
        pairs = round(tokens * g.top_k * g.local_experts / g.global_experts)
        # The local experts a uniform router activates on average at this N (each token picks
        # k distinct of E): the A a captured step of random routing brings.
        typical = round(g.local_experts * (1 - (1 - g.top_k / g.global_experts) ** tokens))
        for active in sorted({*actives, typical}):
            m_here = min(max(pairs, active), tokens * min(g.top_k, active))
            if active > m_here or active < 1:
                continue
            queries.append((tokens, active, m_here))
            if active == typical:
                router.add((tokens, active, m_here))
    qn = np.array([q[0] for q in queries], dtype=np.int64)
    qa = np.array([q[1] for q in queries], dtype=np.int64)
    qm = np.array([q[2] for q in queries], dtype=np.int64)
    values, codes = full.batch(qn, qa, qm)
    door = _door(bundle, entry)
    assert isinstance(door._experts[("experts", "eager")], SegmentedExpertSurface)
    door_answer = door.batch("experts", qn, qa, qm, "eager")
    measured = {(int(x), int(y), int(z)) for x, y, z in zip(n, a, m, strict=True)}
    answered = crossing = 0
    router_answered = router_crossing = 0
    diffs: list[float] = []
    router_diffs: list[float] = []
    examples: list[tuple[float, int, int, int]] = []
    # The segment-aware lookup against each query's own segment's answer, every query.
    own_equal = own_differ = own_refused_both = door_only = full_only = 0
    door_vs_full: list[float] = []
    for j, (qt, qa_, qm_) in enumerate(queries):
        own_index = segment_of.get(qt)
        surface_j = _own_surface(per_segment, own_index, seg, n, a, m, t, g)
        if surface_j is None:
            own_v, own_c = np.array([np.nan]), np.array([1])
        else:
            own_v, own_c = surface_j.batch(qn[j : j + 1], qa[j : j + 1], qm[j : j + 1])
        dc = int(door_answer.code[j])
        if dc == 0 and own_c[0] == 0:
            if door_answer.time_us[j] == own_v[0]:
                own_equal += 1
            else:
                own_differ += 1
        elif dc != 0 and own_c[0] != 0:
            own_refused_both += 1
        else:
            own_differ += 1
        if dc == 0 and codes[j] == 0 and (qt, qa_, qm_) not in measured:
            door_vs_full.append(
                abs(float(values[j]) - door_answer.time_us[j]) / door_answer.time_us[j]
            )
        door_only += int(dc == 0 and codes[j] != 0)
        full_only += int(dc != 0 and codes[j] == 0)
    for j, (qt, qa_, qm_) in enumerate(queries):
        if codes[j] != 0 or (qt, qa_, qm_) in measured:
            continue
        answered += 1
        typical = (qt, qa_, qm_) in router
        router_answered += typical
        used = _vertices(full, float(qt), float(qa_), float(qm_))
        own = segment_of.get(qt)
        if used is None or own is None or all(seg[v] == own for v in used):
            continue
        crossing += 1
        router_crossing += typical
        surface = _own_surface(per_segment, own, seg, n, a, m, t, g)
        if surface is None:
            continue
        v, c = surface.batch(qn[j : j + 1], qa[j : j + 1], qm[j : j + 1])
        if c[0] != 0:
            continue
        d = abs(float(values[j]) - float(v[0])) / float(v[0])
        diffs.append(d)
        if typical:
            router_diffs.append(d)
        examples.append((d, qt, qa_, qm_))
    examples.sort(reverse=True)
    return {
        "queries": len(queries),
        "segment_aware_equal_to_own_segment": own_equal,
        "segment_aware_refused_as_own_segment": own_refused_both,
        "segment_aware_differs_from_own_segment": own_differ,
        "segment_aware_answered_where_whole_refuses": door_only,
        "segment_aware_refused_where_whole_answers": full_only,
        "whole_vs_segment_aware_interpolated": _stats(door_vs_full),
        "whole_changed_by_more_than_1e-12": int(sum(d > 1e-12 for d in door_vs_full)),
        "queries_interpolated": answered,
        "crossing": crossing,
        "crossing_vs_own_segment": _stats(diffs),
        "router_like_interpolated": router_answered,
        "router_like_crossing": router_crossing,
        "router_like_vs_own_segment": _stats(router_diffs),
        "largest": [list(e) for e in examples[:8]],
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--bundle", action="append", type=Path, required=True)
    parser.add_argument("--worst", type=int, default=8)
    parser.add_argument("--json", type=Path)
    parser.add_argument(
        "--dp",
        type=int,
        action="append",
        help="only the TP1/DPd/EPd tables of these DP degrees (repeatable; default: every table)",
    )
    parser.add_argument(
        "--classes",
        choices=sorted(CLASS_RULES),
        help="classify bends under this rule instead of the table's own",
    )
    args = parser.parse_args()
    report: dict[str, Any] = {}

    def pct(s: dict[str, float | int]) -> str:
        if not s.get("answered"):
            return "0"
        return f"{s['answered']}, {s['median']:.1%}, {s['p95']:.1%}, {s['max']:.1%}"

    print(
        "| bundle | target | plain: answered, median, p95, max | switch points | corners | "
        "inside one segment | crossing | both N neighbours on the point's segment | "
        "all but switch points | neither switch nor corner |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    details = []
    for root in args.bundle:
        bundle = open_bundle(root.resolve())
        for entry in bundle.entries:
            if args.dp and entry.target.dp not in args.dp:
                continue
            loo = leave_one_out(bundle, entry, args.worst, args.classes)
            cross = lookup_crossings(bundle, entry)
            name = str(root)
            row = {
                "plain": _stats(loo.all()),
                **{k: _stats(v) for k, v in loo.classes.items()},
                "same_neighbours": _stats(loo.same_neighbours),
                "no_switch": _stats(
                    [e for k, v in loo.classes.items() if k != "switch" for e in v]
                ),
                "no_knot": _stats(loo.classes["inside"] + loo.classes["crossing"]),
                "segmented": {
                    "all": _stats([e for v in loo.segmented.values() for e in v]),
                    **{k: _stats(v) for k, v in loo.segmented.items()},
                    "no_switch": _stats(
                        [e for k, v in loo.segmented.items() if k != "switch" for e in v]
                    ),
                    "no_knot": _stats(loo.segmented["inside"] + loo.segmented["crossing"]),
                },
                "worst": loo.worst,
                "lookup": cross,
                "config_source": loo.source,
            }
            report[f"{name} {loo.target}"] = row
            print(
                f"| {name} | {loo.target} | {pct(row['plain'])} | {pct(row['switch'])} | "
                f"{pct(row['corner'])} | {pct(row['inside'])} | {pct(row['crossing'])} | "
                f"{pct(row['same_neighbours'])} | {pct(row['no_switch'])} | "
                f"{pct(row['no_knot'])} |"
            )
            details.append((name, loo, cross))
    print()
    print(
        "| bundle | target | lookups interpolated | of them across a switch | "
        "their difference from the own-segment answer: answered, median, p95, max | "
        "router-like A only: interpolated, across a switch, difference |"
    )
    print("| --- | --- | --- | --- | --- | --- |")
    for name, loo, cross in details:
        print(
            f"| {name} | {loo.target} | {cross['queries_interpolated']} | {cross['crossing']} | "
            f"{pct(cross['crossing_vs_own_segment'])} | {cross['router_like_interpolated']}, "
            f"{cross['router_like_crossing']}, {pct(cross['router_like_vs_own_segment'])} |"
        )
    print()
    print(
        "Segment-aware leave-one-out (the lookup's `SegmentedExpertSurface`: each removed point "
        "answered from the other points of its own kernel segment)\n"
    )
    print(
        "| bundle | target | all | switch points | corners | inside one segment | "
        "crossing (plain) | all but switch points | neither switch nor corner |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for name, loo, _ in details:
        sg = report[f"{name} {loo.target}"]["segmented"]
        print(
            f"| {name} | {loo.target} | {pct(sg['all'])} | {pct(sg['switch'])} | "
            f"{pct(sg['corner'])} | {pct(sg['inside'])} | {pct(sg['crossing'])} | "
            f"{pct(sg['no_switch'])} | {pct(sg['no_knot'])} |"
        )
    print()
    print(
        "The segment-aware lookup (`DeploymentTables.batch`) on the same queries as above, "
        "against each query's own segment's answer (a surface of its segment's points only)\n"
    )
    print(
        "| bundle | target | queries | equal, bit for bit | both refuse | differ | "
        "answered where one surface refuses | refused where one surface answers | "
        "changed from one surface (interpolated): answered, median, p95, max |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for name, loo, cross in details:
        print(
            f"| {name} | {loo.target} | {cross['queries']} | "
            f"{cross['segment_aware_equal_to_own_segment']} | "
            f"{cross['segment_aware_refused_as_own_segment']} | "
            f"{cross['segment_aware_differs_from_own_segment']} | "
            f"{cross['segment_aware_answered_where_whole_refuses']} | "
            f"{cross['segment_aware_refused_where_whole_answers']} | "
            f"{pct(cross['whole_vs_segment_aware_interpolated'])} |"
        )
    print()
    for name, loo, _ in details:
        print(f"{name} {loo.target} ({loo.source}): the {args.worst} largest plain errors\n")
        print("| N | A | M | class | error |")
        print("| --- | --- | --- | --- | --- |")
        for err, n, a, m, cls in loo.worst:
            print(f"| {n} | {a} | {m} | {cls} | {err:.1%} |")
        print()
    if args.json:
        args.json.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
