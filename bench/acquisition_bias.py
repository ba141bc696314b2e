"""Whether one acquisition reads systematically slower or faster than another (issue 19).

    PYTHONPATH=. python3 bench/acquisition_bias.py REFERENCE OTHER [OTHER ...] \
        [--model Qwen/Qwen3-30B-A3B-Instruct-2507] [--hardware H200] [--variant bf16]

``bench/acquisition_equivalence.py`` says how far two acquisitions are apart (unsigned
change); this says in which direction: per deployment and component, the ratio OTHER /
REFERENCE of every row both measured, as its median and its 5th and 95th percentiles. A
change that only adds noise keeps the median ratio near 1 with symmetric tails; a condition
that slows the kernels (for example, other processes' work on the same GPU) moves the median
and the upper tail up. Each argument is an ``--out-root`` or a shipped bundle directory, as for
``acquisition_equivalence.py``.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from acquisition_equivalence import source, table


def ratio_rows(reference: Path, other: Path, model: str, hardware: str, variant: str) -> list[str]:
    with tempfile.TemporaryDirectory() as scratch:
        a = source(reference, model, hardware, variant, Path(scratch) / "a")
        b = source(other, model, hardware, variant, Path(scratch) / "b")
        lines = []
        for csv in sorted(b.tables.glob("*/components.csv")):
            mine = a.tables / csv.parent.name / "components.csv"
            if not mine.exists():
                continue
            ref, new = table(mine), table(csv)
            for component in sorted({k[0] for k in new}):
                common = [k for k in new if k in ref and k[0] == component]
                if not common:
                    continue
                r = np.array([new[k] / ref[k] for k in common])
                p5, p50, p95 = np.percentile(r, [5, 50, 95])
                lines.append(
                    f"| {other} | {csv.parent.name} | {component} | {len(common)} | "
                    f"{p50:.4f} | {p5:.3f} | {p95:.3f} | {(r > 1).mean() * 100:.0f} % |"
                )
        return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("reference", type=Path)
    parser.add_argument("others", type=Path, nargs="+")
    parser.add_argument("--model", default="Qwen/Qwen3-30B-A3B-Instruct-2507")
    parser.add_argument("--hardware", default="H200")
    parser.add_argument("--variant", default="bf16")
    args = parser.parse_args(argv)
    print(f"reference: {args.reference}\n")
    print("| acquisition | target | component | rows | median ratio | p5 | p95 | slower |")
    print("| --- | --- | --- | ---: | ---: | ---: | ---: | ---: |")
    for other in args.others:
        for line in ratio_rows(args.reference, other, args.model, args.hardware, args.variant):
            print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
