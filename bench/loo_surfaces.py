"""Leave-one-out error of every expert surface of every shipped current-layout bundle (issue 20).

    PYTHONPATH=. .venv/bin/python bench/loo_surfaces.py [--worst 8]

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

from moetables.bundle import Bundle, TableEntry, load_table, open_bundle
from moetables.lookup.surface import ExpertSurface

# vLLM 0.26.0 fused_moe/configs/E=128,N=768,device_name=NVIDIA_H200.json: BLOCK_SIZE_M per key.
TUNED_H200_E128_I768 = {
    1: 16, 2: 16, 4: 16, 8: 16, 16: 16, 24: 16, 32: 16, 48: 16, 64: 16, 96: 16, 128: 16,
    256: 32, 512: 64, 1024: 128, 1536: 128, 2048: 128, 3072: 128, 4096: 128,
}  # fmt: skip


def block_m(rows: int, local_experts: int) -> int:
    """BLOCK_SIZE_M vLLM 0.26.0's TritonExperts uses for ``rows`` token rows (bf16, H200)."""
    if local_experts == 128:
        key = min(TUNED_H200_E128_I768, key=lambda k: abs(k - rows))
        return TUNED_H200_E128_I768[key]
    # get_default_config, bf16: the general defaults.
    if rows <= 32:
        return 16
    if rows <= 96:
        return 32
    if rows <= 512:
        return 64
    return 128


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


def leave_one_out(bundle: Bundle, entry: TableEntry) -> SurfaceLoo:
    table = load_table(bundle.root, entry)
    rows = (table.component == "experts") & (table.mode == "eager") & (table.activated_experts > 0)
    n, a, m, t = (
        table.tokens[rows],
        table.activated_experts[rows],
        table.local_assignments[rows],
        table.time_us[rows],
    )
    errors: list[PointError] = []
    for i in range(len(n)):
        keep = np.arange(len(n)) != i
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
    name = str(bundle.root.relative_to(ROOT / "bundles").parts[0])
    measured = [(int(x), int(y), int(z)) for x, y, z in zip(n, a, m, strict=True)]
    return SurfaceLoo(name, factor, entry.target.deployment, len(n), errors, measured)


def current_bundles() -> list[Bundle]:
    found = [open_bundle(meta.parent) for meta in sorted((ROOT / "bundles").rglob("meta.yaml"))]
    return [b for b in found if b.layout == "current"]


def pct(x: float) -> str:
    return f"{x:.1%}"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--worst", type=int, default=8, help="largest errors listed per f2 table")
    args = parser.parse_args()
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


if __name__ == "__main__":
    main()
