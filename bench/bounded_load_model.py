"""Expected row tiles of a load distribution: unbounded binomial marginals against the bounded
ones `moetables.tiles` uses (each active expert 1 to N pairs), both against loads routed as the
H200 load-spread runs routed them (scripts/h200_load_spread.py: every token picks k distinct
of E experts by weight rank^-alpha; draws with every expert active, as A = E says).

    PYTHONPATH=. .venv/bin/python bench/bounded_load_model.py [--draws 1500]
"""

from __future__ import annotations

import argparse

import numpy as np
from scipy import stats

from moetables.tiles import expected_row_tiles, power_law_shares

CASES = [(384, 0.0, 32), (384, 0.6, 32), (256, 1.2, 32), (1024, 1.2, 64), (2048, 0.6, 64)]


def unbounded(pairs: int, shares: np.ndarray, block_m: int) -> float:
    edges = np.arange(pairs // block_m + 1) * block_m
    unique, times = np.unique(shares, return_counts=True)
    above = stats.binom.sf(edges[None, :], pairs, unique[:, None])
    return float((above.sum(axis=1) * times).sum())


def routed(n: int, alpha: float, block_m: int, draws: int, rng: np.random.Generator) -> float:
    logw = np.log(power_law_shares(128, alpha))
    kept = []
    for _ in range(draws):
        picks = np.argpartition(-(logw + rng.gumbel(size=(n, 128))), 7, axis=1)[:, :8]
        counts = np.bincount(picks.ravel(), minlength=128)
        if (counts > 0).all():
            kept.append(int((-(-counts // block_m)).sum()))
    return float(np.mean(kept)) if kept else float("nan")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--draws", type=int, default=1500)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    print("| N | alpha | block | routed tiles | unbounded | off | bounded | off |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for n, alpha, block in CASES:
        shares = power_law_shares(128, alpha)
        ref = routed(n, alpha, block, args.draws, rng)
        old = unbounded(8 * n, shares, block)
        new = expected_row_tiles(8 * n, shares, block, rows=n)
        print(
            f"| {n} | {alpha} | {block} | {ref:.2f} | {old:.2f} | {old / ref - 1:+.2%} | "
            f"{new:.2f} | {new / ref - 1:+.2%} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
