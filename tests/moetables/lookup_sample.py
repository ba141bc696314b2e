"""A fixed sample of expert lookups over every shipped bundle, per table and mode.

``test_kernel_segments.py`` compares today's answers with ``data/lookup_sample_values.json``.
The kernel-segment change (session 5) was checked against the code before it (commit 704c221)
bit for bit: exactly the four kernel-step tables changed. The committed values were written
after that check, by this module against today's code, so every other table's values are the
answers the code gave before kernel segments:

    PYTHONPATH=. .venv/bin/python tests/moetables/lookup_sample.py > \
        tests/moetables/data/lookup_sample_values.json

Values, not digests: numpy sums in an order that depends on the CPU's vector width, so a float
may differ in its last bits between machines; the test allows that and nothing more.
It reads only the public lookup door (``ComponentTables``, ``DeploymentTables.batch`` and
``time_us``).
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
BUNDLES = ROOT / "bundles"
QUERIES = 160  # per table and mode: random feasible points of the table's own ranges
SCALARS = 40  # of them also asked one by one (the scalar path)


def bundle_roots() -> list[Path]:
    return sorted(p.parent for p in BUNDLES.rglob("meta.yaml"))


def sample(
    tokens: np.ndarray, top_k: int, local: int, remote: int, seed: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Random (N, A, M) over the table's N range, A in 0..L, M in (mostly) the feasible range:
    inside, on, and outside the measured hull, plus infeasible and all-remote rows."""
    rng = np.random.default_rng(seed)
    lo, hi = int(tokens.min()), int(tokens.max())
    n = np.exp(rng.uniform(np.log(max(lo, 1)), np.log(hi * 1.2 + 1), QUERIES)).astype(np.int64)
    n = np.maximum(n, 1)
    a = rng.integers(0, local + 2, QUERIES)
    floor = np.maximum(a, n * max(0, top_k - remote))
    ceil = n * np.minimum(top_k, a)
    m = (floor + rng.uniform(-0.05, 1.05, QUERIES) * (ceil - floor)).astype(np.int64)
    m[a == 0] = 0
    return n, a.astype(np.int64), m


def _float(x: float) -> float | None:
    return None if np.isnan(x) else float(x)


def answers() -> dict[str, dict[str, list[Any]]]:
    """Per table and mode: the batch answers (NaN as None), their codes, and the scalar path's
    answers for the first queries (a refusal as the exception's class name)."""
    from moetables.lookup import ComponentTables

    out: dict[str, dict[str, list[Any]]] = {}
    for root in bundle_roots():
        tables = ComponentTables(root)
        for entry in tables.bundle.entries:
            t = entry.target
            d = tables.deployment(t.tp, t.dp, t.rank, t.sequence_parallel)
            g = entry.geometry
            for mode in d.modes:
                if "experts" not in d.components:
                    continue
                key = f"{root.relative_to(BUNDLES)} tp{t.tp} {t.deployment} {mode}"
                seed = int.from_bytes(hashlib.sha256(key.encode()).digest()[:4], "little")
                tok = d._expert_points[mode][0] if hasattr(d, "_expert_points") else None
                if tok is None:
                    continue
                n, a, m = sample(tok, g.top_k, g.local_experts, g.remote_experts, seed)
                got = d.batch("experts", n, a, m, mode)
                scalars: list[Any] = []
                for i in range(SCALARS):
                    try:
                        scalars.append(d.time_us("experts", int(n[i]), int(a[i]), int(m[i]), mode))
                    except (LookupError, ValueError) as exc:  # the kind of refusal counts
                        scalars.append(type(exc).__name__)
                out[key] = {
                    "batch": [_float(x) for x in got.time_us],
                    "code": [int(c) for c in got.code],
                    "scalar": scalars,
                }
    return out


if __name__ == "__main__":
    json.dump(answers(), sys.stdout, sort_keys=True)
    sys.stdout.write("\n")
