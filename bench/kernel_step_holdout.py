"""Independent points: a denser table's extra expert points answered by a sparser table.

    PYTHONPATH=. python3 bench/kernel_step_holdout.py DENSE SPARSE [--dp 1 --rank 0] [--worst 8]

DENSE and SPARSE are bundle directories (``.../bf16``) of the same model measured with two
plans (for example rule v4 and rule v3), compared at one TP1 target (``--dp``/``--rank``: the
TP1/DPd/EPd rank; TP1/DP1 by default). Every expert point DENSE measured and SPARSE did
not is looked up in SPARSE (its own lookup: segment-aware where its contract records kernel
steps) and compared with DENSE's measured time. Unlike leave-one-out, nothing is removed: the
question is how far the sparser table's interpolation is from a measurement it never saw, the
error a user of the sparser table gets there (issue 20 item 1). Both tables carry the
repeatability of the method (0.1-0.5 % median between runs) and of their GPUs
(`bench/gpu_units.py`).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from moetables.lookup.tables import ComponentTables

sys.path.insert(0, str(Path(__file__).resolve().parent))
from acquisition_equivalence import table


def experts(root: Path, dp: int = 1, rank: int = 0) -> dict[tuple[str, int, int, int], float]:
    path = root / f"tp1/moe_components/dp{dp}_ep{dp}_rank{rank}_sp0/components.csv"
    return {k: v for k, v in table(path).items() if k[0] == "experts"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dense", type=Path)
    parser.add_argument("sparse", type=Path)
    parser.add_argument("--dp", type=int, default=1, help="TP1/DPd/EPd (1: TP1/DP1)")
    parser.add_argument("--rank", type=int, default=0)
    parser.add_argument("--worst", type=int, default=8)
    args = parser.parse_args()
    dense = experts(args.dense, args.dp, args.rank)
    sparse = experts(args.sparse, args.dp, args.rank)
    lookup = ComponentTables(args.sparse).deployment(1, args.dp, args.rank)
    errors: list[tuple[float, int, int, int]] = []
    refused: list[tuple[int, int, int]] = []
    for (_, n, a, m), measured in sorted(dense.items()):
        if ("experts", n, a, m) in sparse:
            continue
        try:
            answer = lookup.experts_time_us(n, a, m)
        except Exception:  # a refusal (outside the sparser table's support) is counted
            refused.append((n, a, m))
            continue
        errors.append((answer / measured - 1, n, a, m))
    if not errors:
        raise SystemExit("no point of DENSE is answered by SPARSE")
    size = np.array([abs(e[0]) for e in errors]) * 100
    print(f"{args.dense} -> {args.sparse} (TP1/DP{args.dp} rank {args.rank})")
    print(
        f"{len(errors)} points answered ({len(refused)} refused): |error| median "
        f"{np.median(size):.2f} %, p95 {np.percentile(size, 95):.2f} %, max {size.max():.2f} %, "
        f"above 5 %: {(size > 5).sum()}"
    )
    for error, n, a, m in sorted(errors, key=lambda e: -abs(e[0]))[: args.worst]:
        print(f"  N={n} A={a} M={m}: {error * 100:+.1f} %")


if __name__ == "__main__":
    main()
