"""Leave-one-out error of every expert surface of every shipped current-layout bundle (issue 20).

    PYTHONPATH=. .venv/bin/python bench/loo_surfaces.py [--worst 8]
    PYTHONPATH=. .venv/bin/python bench/loo_surfaces.py --predict-kernel-steps
    PYTHONPATH=. .venv/bin/python bench/loo_surfaces.py --bundle DIR [--bundle DIR ...]

Each measured positive expert point (A > 0) is removed in turn, the surface rebuilt from the
others with the lookups' own code (``ExpertSurface``: raw coordinates and the simplex locator
every lookup uses) and the point asked of it. Points on the hull cannot be enclosed once removed
and are refused (never extrapolated), so they are left out of the error. Relative error of the
answer against the measurement; eager rows (every shipped current table is eager).

Where the large errors sit is read against the Triton kernel's tiles, from configuration only:
vLLM 0.26.0's ``TritonExperts`` picks its BLOCK_SIZE_M from the rows it is given (N here) and
the local expert count E: the tuned ``E=128,N=768,device_name=NVIDIA_H200.json`` (nearest key
to N) at E=128, ``get_default_config`` at E=64 (no tuned H200 file for 64 experts of width
768). ``moe_align_block_size`` pads each expert's pairs to a multiple of BLOCK_SIZE_M, so the
kernel's row tiles are sum_e ceil(m_e / B) = A x ceil(M / (A x B)) for balanced stimuli.
Nothing here changes the planner (R10: plan points come from configuration, never latencies).

``--predict-kernel-steps`` reads today's factor-2 vLLM tables against the plan the kernel-step
rule (``acquisition.plan.kernel``) would give the same targets: which of today's large errors
would be bracketed (both planned neighbours in N run the point's own kernel, and the row tiles
are linear between its planned neighbours in M), and today's error level at points that are
already bracketed, the level to expect there. ``--bundle DIR`` analyses the given bundles only
(a new acquisition before it is shipped) and adds the kernel-aware leave-one-out: each point
answered only from the points of its own kernel segment in N (the rows between two switches of
the kernel's configuration), and points that are bends themselves (next to a switch, or a
corner of the row tiles: ``is_knot``) refused like hull points: removed, such a point could
only be interpolated across the bend it marks; kept, it answers itself exactly.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from acquisition.plan import CaptureSizes, CudagraphMode, build_plan
from acquisition.plan.kernel import KERNEL_STEPS_RULE, KernelSteps
from moetables.bundle import Bundle, TableEntry, load_table, open_bundle
from moetables.geometry import ExpertGeometry
from moetables.lookup.surface import ExpertSurface
from moetables.triton_config import KernelShape


def block_m(rows: int, local_experts: int, width: int = 768) -> int:
    """BLOCK_SIZE_M vLLM 0.26.0's TritonExperts uses for ``rows`` token rows (bf16, H200):
    `moetables.triton_config`'s choice, the planner's and the tile model's table."""
    return KernelShape("NVIDIA_H200", local_experts, width).config(rows).block_m


def row_tiles(rows: int, active: int, pairs: int, local_experts: int) -> int:
    """Row tiles of the balanced stimulus: each active expert's pairs padded to BLOCK_SIZE_M."""
    b = block_m(rows, local_experts)
    base, extra = divmod(pairs, active)
    return extra * math.ceil((base + 1) / b) + (active - extra) * math.ceil(base / b)


@dataclass(frozen=True)
class PointError:
    tokens: int
    active: int
    pairs: int
    measured: float
    answer: float

    @property
    def error(self) -> float:
        return abs(self.answer - self.measured) / self.measured


@dataclass(frozen=True)
class SurfaceLoo:
    bundle: str
    factor: float | None
    target: str
    points: int
    errors: list[PointError]
    measured: list[tuple[int, int, int]]

    def steps(self, e: PointError, local: int) -> tuple[bool, bool]:
        """Whether a measured neighbour of the point runs another BLOCK_SIZE_M (in N) or
        another number of row tiles (in M, same N and A): the point sits at a step."""
        ns = sorted({n for n, _, _ in self.measured})
        i = ns.index(e.tokens)
        near_n = [ns[j] for j in (i - 1, i + 1) if 0 <= j < len(ns)]
        n_step = any(block_m(n, local) != block_m(e.tokens, local) for n in near_n)
        ms = sorted({m for n, a, m in self.measured if n == e.tokens and a == e.active})
        k = ms.index(e.pairs)
        near_m = [ms[j] for j in (k - 1, k + 1) if 0 <= j < len(ms)]
        tiles = row_tiles(e.tokens, e.active, e.pairs, local)
        m_step = any(row_tiles(e.tokens, e.active, m, local) != tiles for m in near_m)
        return n_step, m_step

    @property
    def answered(self) -> int:
        return len(self.errors)

    def quantile(self, q: float) -> float:
        return float(np.percentile([e.error for e in self.errors], q))


def kernel_steps(entry: TableEntry) -> KernelSteps:
    """The kernel-step rule of a table's target: its hardware, expert width and quantization
    (block FP8 reads the ``dtype=fp8_w8a8,block_shape=[..]`` files), as the contract records."""
    g = entry.geometry
    geometry = entry.contract.get("geometry") or {}
    block = geometry.get("weight_block_size")
    # The rule the table was planned with (v2, v3 or v4), as its contract records it.
    record = (entry.contract.get("expert_sampling") or {}).get("kernel_steps") or {}
    return KernelSteps.for_target(
        rule=str(record.get("rule", KERNEL_STEPS_RULE)),
        hardware=str(entry.contract.get("hardware", "H200")),
        dtype=str(geometry.get("dtype") or "bf16"),
        local_experts=g.local_experts,
        global_experts=g.global_experts,
        top_k=g.top_k,
        width=int(geometry.get("expert_intermediate_size", 768)),
        quantization=geometry.get("quantization"),
        weight_block=(int(block[0]), int(block[1])) if block else None,
    )


def leave_one_out(
    bundle: Bundle, entry: TableEntry, *, kernel_aware: bool = False, label_model: bool = False
) -> SurfaceLoo:
    """Leave-one-out over the positive expert points; ``kernel_aware``: each point answered
    from the other points of its own kernel segment only (refused where they do not enclose it)."""
    table = load_table(bundle.root, entry)
    rows = (table.component == "experts") & (table.mode == "eager") & (table.activated_experts > 0)
    n, a, m, t = (
        table.tokens[rows],
        table.activated_experts[rows],
        table.local_assignments[rows],
        table.time_us[rows],
    )
    errors: list[PointError] = []
    segment = np.zeros(len(n), dtype=np.int64)
    steps = kernel_steps(entry)
    if kernel_aware:
        kernels: dict[object, int] = {}
        segment = np.array([kernels.setdefault(steps.kernel(int(x)), len(kernels)) for x in n])
    for i in range(len(n)):
        keep = (np.arange(len(n)) != i) & (segment == segment[i])
        if np.unique(n[keep]).size < 2:
            continue
        here = PointError(int(n[i]), int(a[i]), int(m[i]), float(t[i]), float(t[i]))
        if kernel_aware and is_knot(here, steps):
            continue  # a bend the plan measures: kept, it answers itself exactly
        surface = ExpertSurface(
            n[keep], a[keep], m[keep], t[keep], entry.geometry, label="loo", coordinates="raw"
        )
        values, codes = surface.batch(n[i : i + 1], a[i : i + 1], m[i : i + 1])
        if codes[0] == 0:
            errors.append(
                PointError(int(n[i]), int(a[i]), int(m[i]), float(t[i]), float(values[0]))
            )
    sampling = entry.contract.get("expert_sampling")
    factor = sampling.get("factor") if isinstance(sampling, dict) else None
    try:
        name = str(bundle.root.relative_to(ROOT / "bundles").parts[0])
    except ValueError:
        name = str(bundle.root)
    if label_model:
        name = f"{name} {entry.contract.get('model', {}).get('name', '?')}"
    measured = [(int(x), int(y), int(z)) for x, y, z in zip(n, a, m, strict=True)]
    return SurfaceLoo(name, factor, entry.target.deployment, len(n), errors, measured)


def planned_with_rule(entry: TableEntry) -> set[tuple[int, int, int]]:
    """The expert points the kernel-step rule would plan for this table's target."""
    graph = entry.contract["sampling_graph"]["source"]
    sampling = entry.contract["expert_sampling"]
    captures = graph["capture_sizes"]
    g = entry.geometry
    plan = build_plan(
        entry.target,
        ExpertGeometry(g.global_experts, g.top_k, g.local_experts),
        ("experts",),
        max_num_batched_tokens=int(graph["max_num_batched_tokens"]),
        max_num_seqs=int(graph["max_num_seqs"]),
        factor=float(sampling["factor"]),
        mode=CudagraphMode(graph["cudagraph_mode"]),
        captures=CaptureSizes(tuple(captures["sizes"]), captures["source"], captures.get("rule")),
        kernel=kernel_steps(entry),
    )
    return {(p.tokens, p.activated_experts, p.local_assignments) for p in plan.points}


def bracketed(
    e: PointError, points: set[tuple[int, int, int]], steps: KernelSteps
) -> tuple[bool, bool]:
    """Whether the point's LOO among ``points`` stays inside one kernel (in N) and one
    piece of the row tiles (in M, same N and A)."""
    ns = sorted({n for n, a, _ in points if a == e.active and n != e.tokens})
    below = [n for n in ns if n < e.tokens]
    above = [n for n in ns if n > e.tokens]
    here = steps.kernel(e.tokens)
    in_n = all(side and steps.kernel(side[-1 if side is below else 0]) == here
               for side in (below, above))  # fmt: skip
    ms = sorted(m for n, a, m in points if (n, a) == (e.tokens, e.active) and m != e.pairs)
    lo = [m for m in ms if m < e.pairs]
    hi = [m for m in ms if m > e.pairs]
    if not lo or not hi:
        return in_n, True  # M has no neighbours on one side: nothing in M to bracket
    b = steps.config(e.tokens).block_m
    m0, m1 = lo[-1], hi[0]

    def tiles(m: int) -> int:
        base, extra = divmod(m, e.active)
        return extra * math.ceil((base + 1) / b) + (e.active - extra) * math.ceil(base / b)

    linear = all(
        tiles(m) * (m1 - m0) == tiles(m0) * (m1 - m) + tiles(m1) * (m - m0)
        for m in range(m0, m1 + 1)
    )
    return in_n, linear


def is_knot(e: PointError, steps: KernelSteps) -> bool:
    """Whether the point is itself where the surface bends: its N next to a switch of the kernel,
    or its M (at EP1, its N) a corner of the balanced row tiles. Removed, such a point can only
    be interpolated across the bend it marks; kept, a query there is answered exactly."""
    if steps.kernel(max(1, e.tokens - 1)) != steps.kernel(e.tokens) or steps.kernel(
        e.tokens + 1
    ) != steps.kernel(e.tokens):
        return True
    # Rule v4 also plans the A on both sides of each ramp's ends along A at EP1's 16-row rows:
    # removed, such a point is interpolated across the bend in A it marks.
    if steps.active_side and e.active in steps.active_corners(e.tokens):
        return True
    b = steps.config(e.tokens).block_m
    ep1 = steps.local_experts == steps.global_experts

    def tiles(m: int) -> int:
        if steps.naive(e.tokens):
            return m
        base, extra = divmod(m, e.active)
        return extra * math.ceil((base + 1) / b) + (e.active - extra) * math.ceil(base / b)

    step = steps.top_k if ep1 else 1  # at EP1 a neighbouring row is k pairs away
    if e.pairs - step < e.active:
        return False
    t0, t1, t2 = tiles(e.pairs - step), tiles(e.pairs), tiles(e.pairs + step)
    if t1 - t0 != t2 - t1:
        return True
    if not steps.ramp_edges or steps.naive(e.tokens):
        return False

    # Rule v3 also plans both edges of each ramp: where the largest expert's tiles step (the
    # first expert into the next tile) and where the smallest's do (the last one).
    def largest(m: int) -> int:
        base, extra = divmod(m, e.active)
        return math.ceil((base + (extra > 0)) / b)

    def smallest(m: int) -> int:
        return math.ceil((m // e.active) / b)

    return largest(e.pairs - step) != largest(e.pairs) or smallest(e.pairs) != smallest(
        e.pairs + step
    )


def predict_kernel_steps(
    results: list[SurfaceLoo], entries: dict[tuple[str, str], TableEntry]
) -> None:
    print("### The kernel-step plan against today's errors (configuration only, predicted)\n")
    print(
        "Today's answered points, judged by the neighbours they would have in the plan of the "
        "kernel-step rule (same target and options): bracketed = both neighbours in N run the "
        "point's kernel and the row tiles are linear between its neighbours in M. Today's "
        "already-bracketed points show the error level inside one kernel; a bend itself is a "
        "point the rule's knots sit on (next to a switch in N, or a corner of the row tiles): "
        "answered exactly when kept, only across its bend when left out.\n"
    )
    print(
        "| bundle | target | kernel configuration | points now | points with the rule | > 5 % now | of them bracketed "
        "with the rule | of them a bend themselves | neither | bracketed today: answered, "
        "median, p95 | not bracketed today: median, p95 |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in results:
        if r.factor != 2 or not r.bundle.startswith("H200-vllm"):
            continue
        entry = entries[(r.bundle, r.target)]
        steps = kernel_steps(entry)
        planned = planned_with_rule(entry)
        now = set(r.measured)
        big = [e for e in r.errors if e.error > 0.05]
        fixed = sum(all(bracketed(e, planned, steps)) for e in big)
        knots = sum(not all(bracketed(e, planned, steps)) and is_knot(e, steps) for e in big)
        inside = [e.error for e in r.errors if all(bracketed(e, now, steps))]
        outside = [e.error for e in r.errors if not all(bracketed(e, now, steps))]

        def stats(x: list[float]) -> str:
            if not x:
                return "-"
            return f"{pct(float(np.median(x)))}, {pct(float(np.percentile(x, 95)))}"

        print(
            f"| {r.bundle} | {r.target} | {steps.source} | {r.points} | "
            f"{sum(1 for p in planned if p[1] > 0)} | "
            f"{len(big)} | {fixed} | {knots} | {len(big) - fixed - knots} | {len(inside)}, "
            f"{stats(inside)} | {stats(outside)} |"
        )
    print()


def current_bundles() -> list[Bundle]:
    found = [open_bundle(meta.parent) for meta in sorted((ROOT / "bundles").rglob("meta.yaml"))]
    return [b for b in found if b.layout == "current"]


def pct(x: float) -> str:
    return f"{x:.1%}"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--worst", type=int, default=8, help="largest errors listed per f2 table")
    parser.add_argument(
        "--predict-kernel-steps",
        action="store_true",
        help="only the factor-2 vLLM tables against the kernel-step plan",
    )
    parser.add_argument(
        "--bundle",
        action="append",
        type=Path,
        default=[],
        help="analyse these bundle directories (plain and kernel-aware LOO) instead",
    )
    args = parser.parse_args()
    if args.bundle:
        analyse_bundles(args.bundle, args.worst)
        return
    if args.predict_kernel_steps:
        bundles = [
            b for b in current_bundles() if b.root.relative_to(ROOT / "bundles").parts[0]
            in ("H200-vllm-modular-f2", "H200-vllm-live-f2", "H200-vllm-modular-fp8-f2",
                "H200-vllm-live-fp8-f2")
        ]  # fmt: skip
        pairs = [(b, e) for b in bundles for e in b.entries]
        results = [leave_one_out(b, e, label_model=True) for b, e in pairs]
        entries = {(r.bundle, r.target): e for r, (_, e) in zip(results, pairs, strict=True)}
        predict_kernel_steps(results, entries)
        return
    results = [leave_one_out(b, e) for b in current_bundles() for e in b.entries]

    print("### Leave-one-out error of every expert surface (raw coordinates, lookups' locator)\n")
    print("| bundle | grid factor | target | points | answered | median | p95 | max | > 5 % |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in results:
        big = sum(e.error > 0.05 for e in r.errors)
        print(
            f"| {r.bundle} | {r.factor:g} | {r.target} | {r.points} | {r.answered} | "
            f"{pct(r.quantile(50))} | {pct(r.quantile(95))} | {pct(r.quantile(100))} | {big} |"
        )
    print()

    print("### Factor 8 against factor 2, same backend and target\n")
    print("| backend | target | factor 8: points, median, p95 | factor 2: points, median, p95 |")
    print("| --- | --- | --- | --- |")
    by = {(r.bundle, r.target): r for r in results}
    for label, coarse, fine in (
        ("vllm-modular", "H200", "H200-vllm-modular-f2"),
        ("vllm-live", "H200-vllm-live", "H200-vllm-live-f2"),
    ):
        for target in sorted({t for (b, t) in by if b == coarse}):
            c, f = by.get((coarse, target)), by.get((fine, target))
            if c is None or f is None:
                continue
            print(
                f"| {label} | {target} | {c.answered}, {pct(c.quantile(50))}, "
                f"{pct(c.quantile(95))} | {f.answered}, {pct(f.quantile(50))}, "
                f"{pct(f.quantile(95))} |"
            )
    print()

    print("### Large errors next to a tile step\n")
    print(
        "Answered points above 5 %, and how many have a measured neighbour in N that runs "
        "another BLOCK_SIZE_M, or one in M (same N, A) with another number of row tiles:\n"
    )
    print(
        "| bundle | target | > 5 % | N step | M step | either | neither | "
        "points at a step: > 5 % | other points: > 5 % |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in results:
        if not r.bundle.startswith("H200-vllm") or r.factor != 2:
            continue
        local = 128 if r.target.startswith("dp1") else 64
        flags = [r.steps(e, local) for e in r.errors if e.error > 0.05]
        n_step = sum(f[0] for f in flags)
        m_step = sum(f[1] for f in flags)
        either = sum(f[0] or f[1] for f in flags)
        stepped = sum(any(r.steps(e, local)) for e in r.errors)
        others = len(r.errors) - stepped
        print(
            f"| {r.bundle} | {r.target} | {len(flags)} | {n_step} | {m_step} | {either} | "
            f"{len(flags) - either} | {either} of {stepped} ({either / stepped:.0%}) | "
            f"{len(flags) - either} of {others} ({(len(flags) - either) / others:.0%}) |"
        )
    print()

    print("### Where the errors sit: median and p95 by the rows N the kernel is given\n")
    for r in results:
        if r.factor != 2 or not r.bundle.startswith("H200-vllm"):
            continue
        local = 128 if r.target.startswith("dp1") else 64
        print(f"{r.bundle} {r.target} (E={local} local experts):\n")
        print("| N | BLOCK_SIZE_M | answered | median | p95 | max |")
        print("| --- | --- | --- | --- | --- | --- |")
        for tokens in sorted({e.tokens for e in r.errors}):
            errs = [e.error for e in r.errors if e.tokens == tokens]
            print(
                f"| {tokens} | {block_m(tokens, local)} | {len(errs)} | "
                f"{pct(statistics.median(errs))} | {pct(float(np.percentile(errs, 95)))} | "
                f"{pct(max(errs))} |"
            )
        print()
        print(f"The {args.worst} largest errors:\n")
        print(
            "| N | A | M | M/A | BLOCK_SIZE_M at N/2, N, 2N | row tiles | measured us | "
            "LOO answer us | error |"
        )
        print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
        for e in sorted(r.errors, key=lambda e: -e.error)[: args.worst]:
            blocks = ", ".join(
                str(block_m(max(1, x), local)) for x in (e.tokens // 2, e.tokens, 2 * e.tokens)
            )
            print(
                f"| {e.tokens} | {e.active} | {e.pairs} | {e.pairs / e.active:.1f} | {blocks} | "
                f"{row_tiles(e.tokens, e.active, e.pairs, local)} | {e.measured:.1f} | "
                f"{e.answer:.1f} | {pct(e.error)} |"
            )
        print()


def analyse_bundles(roots: list[Path], worst: int) -> None:
    """Plain and kernel-aware LOO of the given bundles (issue 20's goal: median <= 1.5 %,
    p95 <= 5 %), with the largest plain errors and whether the rule placed them at a switch."""
    print("| bundle | target | points | plain: answered, median, p95, max | kernel-aware: "
          "answered, median, p95, max |")  # fmt: skip
    print("| --- | --- | --- | --- | --- |")
    plain_all: list[tuple[str, SurfaceLoo, KernelSteps]] = []
    for root in roots:
        bundle = open_bundle(root.resolve())
        for entry in bundle.entries:
            plain = leave_one_out(bundle, entry)
            aware = leave_one_out(bundle, entry, kernel_aware=True)
            plain_all.append((str(root), plain, kernel_steps(entry)))

            def stats(r: SurfaceLoo) -> str:
                if not r.errors:
                    return "0"
                return (
                    f"{r.answered}, {pct(r.quantile(50))}, {pct(r.quantile(95))}, "
                    f"{pct(r.quantile(100))}"
                )

            print(f"| {root} | {plain.target} | {plain.points} | {stats(plain)} | {stats(aware)} |")
    print()
    for root_name, r, entry_steps in plain_all:
        print(f"{root_name} {r.target} ({entry_steps.source}): the {worst} largest plain errors\n")
        print(
            "| N | A | M | kernel segment of N is one row | measured us | LOO answer us | error |"
        )
        print("| --- | --- | --- | --- | --- | --- | --- |")
        for e in sorted(r.errors, key=lambda e: -e.error)[:worst]:
            lonely = not any(
                n != e.tokens and entry_steps.kernel(n) == entry_steps.kernel(e.tokens)
                for n, _, _ in r.measured
            )
            print(
                f"| {e.tokens} | {e.active} | {e.pairs} | {'yes' if lonely else 'no'} | "
                f"{e.measured:.1f} | {e.answer:.1f} | {pct(e.error)} |"
            )
        print()


if __name__ == "__main__":
    main()
