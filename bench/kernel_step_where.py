"""Where the segment-aware leave-one-out errors above a threshold sit between bends, and which
measured points answered them (issue 20 item 1; docs/benchmarks.md, "Rule v3").

    PYTHONPATH=. .venv/bin/python bench/kernel_step_where.py --bundle B [--bundle B2] \
        [--deployment dp1_ep1_rank0_sp0] [--threshold 0.05] [--json out.json] [--rule v4]

Same classes and same segment-aware surface as `bench/kernel_step_loo.py` (switch rows and tile
corners excluded: the points "between bends"); per error above the threshold it prints (N, A, M),
the N's configuration (BLOCK_SIZE_M, segment span), the vertices of the simplex that answered it
(N, A, M each) and what the answer lacked: the nearest measured A below/above at the same N, and
the nearest measured N below/above at the same A, in the point's own segment.

``--rule v4`` (a prediction, nothing measured): per error, what that rule's plan would add at
the error's row N beside the A the table measured there (`KernelSteps.active_points`): the new
A between the error's measured A neighbours (``lands``: its answer would come from them, not
across the old factor-2 gap), and whether the error's own (N, A) is a bend under that rule
(``bend``: an A-side tile corner, measured and excluded from "between bends").
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from acquisition.plan.kernel import KERNEL_STEPS_RULE_V3, KERNEL_STEPS_RULE_V4, KernelSteps
from bench.kernel_step_loo import _door, _positive, _switch
from bench.loo_surfaces import PointError, is_knot, kernel_steps
from moetables.bundle import open_bundle
from moetables.lookup.segments import SegmentedExpertSurface

RULES = {"v3": KERNEL_STEPS_RULE_V3, "v4": KERNEL_STEPS_RULE_V4}


def _with_rule(steps: KernelSteps, rule: str) -> KernelSteps:
    return KernelSteps(
        shape=steps.shape,
        global_experts=steps.global_experts,
        top_k=steps.top_k,
        expert_map=steps.expert_map,
        assignment_steps=steps.assignment_steps,
        rule=rule,
    )


def where(
    bundle_root: Path, deployment: str, threshold: float, rule: str | None = None
) -> list[dict[str, Any]]:
    bundle = open_bundle(bundle_root.resolve())
    out: list[dict[str, Any]] = []
    for entry in bundle.entries:
        if entry.target.deployment != deployment:
            continue
        n, a, m, t = _positive(bundle, entry)
        steps = kernel_steps(entry)
        planned = _with_rule(steps, RULES[rule]) if rule else None
        switches = _door(bundle, entry).kernel_switches
        sw = np.asarray(switches.switches(int(n.max())), dtype=np.int64)
        seg = np.searchsorted(sw, n, side="left")
        for i in range(len(n)):
            p = PointError(int(n[i]), int(a[i]), int(m[i]), float(t[i]), 0.0)
            if _switch(steps, int(n[i])) or is_knot(p, steps):
                continue
            mine = (np.arange(len(n)) != i) & (seg == seg[i])
            s = SegmentedExpertSurface(
                n[mine], a[mine], m[mine], t[mine], entry.geometry, switches, label="w"
            )
            v, c = s.batch(n[i : i + 1], a[i : i + 1], m[i : i + 1])
            if c[0] != 0:
                continue
            err = abs(float(v[0]) - float(t[i])) / float(t[i])
            if err <= threshold:
                continue
            idx = np.flatnonzero(mine)
            same_n = sorted({int(x) for x in a[idx][n[idx] == n[i]]})
            same_a = sorted({int(x) for x in n[idx][a[idx] == a[i]]})
            lo = int(sw[seg[i] - 1]) + 1 if seg[i] > 0 else 1
            hi = int(sw[seg[i]]) if seg[i] < len(sw) else None
            below = max((x for x in same_n if x < a[i]), default=None)
            above = min((x for x in same_n if x > a[i]), default=None)
            prediction: dict[str, Any] = {}
            if planned is not None:
                axis = sorted({*same_n, int(a[i])})
                added = planned.active_points(int(n[i]), axis)
                prediction = {
                    "rule": planned.rule,
                    "added_at_N": added,
                    "lands": [
                        x
                        for x in added
                        if (below is None or x > below) and (above is None or x < above)
                    ],
                    "bend": int(a[i]) in planned.active_corners(int(n[i])),
                }
            out.append(
                {
                    "deployment": deployment,
                    "N": int(n[i]),
                    "A": int(a[i]),
                    "M": int(m[i]),
                    "err": round(err, 4),
                    "block_m": steps.config(int(n[i])).block_m,
                    "naive": steps.naive(int(n[i])),
                    "segment": [lo, hi],
                    "A_below": below,
                    "A_above": above,
                    "N_below": max((x for x in same_a if x < n[i]), default=None),
                    "N_above": min((x for x in same_a if x > n[i]), default=None),
                    "A_in_segment": sorted({int(x) for x in a[idx]}),
                    **prediction,
                }
            )
    return sorted(out, key=lambda r: (r["N"], r["A"]))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--bundle", action="append", type=Path, required=True)
    p.add_argument("--deployment", default="dp1_ep1_rank0_sp0")
    p.add_argument("--threshold", type=float, default=0.05)
    p.add_argument("--json", type=Path)
    p.add_argument(
        "--rule", choices=sorted(RULES), help="also print what this rule's plan adds at each row"
    )
    args = p.parse_args()
    rows: list[dict[str, Any]] = []
    for b in args.bundle:
        for r in where(b, args.deployment, args.threshold, args.rule):
            r["bundle"] = str(b)
            rows.append(r)
            print(
                f"{b.parts[1] if len(b.parts) > 1 else b} N={r['N']} A={r['A']} M={r['M']} "
                f"err={100 * r['err']:.1f}% B={r['block_m']} naive={r['naive']} seg={r['segment']} "
                f"A-/A+ at N: {r['A_below']}/{r['A_above']}  N-/N+ at A: "
                f"{r['N_below']}/{r['N_above']}  A in seg: {r['A_in_segment']}"
                + (
                    f"  {args.rule}: adds A {r['added_at_N']} at N, lands {r['lands']}, "
                    f"bend {r['bend']}"
                    if args.rule
                    else ""
                )
            )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
