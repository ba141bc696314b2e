"""A fixed sample of expert lookups over every shipped bundle, digested per table and mode.

Used by ``test_kernel_segments.py`` to show that the kernel-segment change leaves every table
without ``expert_sampling.kernel_steps`` bit for bit as it was: the digests in
``data/lookup_sample_digests.json`` were written by this module run against the code before the
change (commit 704c221):

    git archive 704c221 | tar -x -C /tmp/before
    PYTHONPATH=/tmp/before .venv/bin/python tests/moetables/lookup_sample.py > \
        tests/moetables/data/lookup_sample_digests.json

It reads only the public lookup door (``ComponentTables``, ``DeploymentTables.batch`` and
``time_us``), which both versions have.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
BUNDLES = ROOT / "bundles"
QUERIES = 600  # per table and mode: random feasible points of the table's own ranges
SCALARS = 60  # of them also asked one by one (the scalar path), to the same digest


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


def digests() -> dict[str, str]:
    from moetables.lookup import ComponentTables

    out: dict[str, str] = {}
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
                h = hashlib.sha256()
                h.update(got.time_us.tobytes())
                h.update(got.code.tobytes())
                for i in range(SCALARS):
                    try:
                        h.update(
                            repr(
                                d.time_us("experts", int(n[i]), int(a[i]), int(m[i]), mode)
                            ).encode()
                        )
                    except (LookupError, ValueError) as exc:  # the kind of refusal is digested
                        h.update(type(exc).__name__.encode())
                out[key] = h.hexdigest()
    return out


if __name__ == "__main__":
    json.dump(digests(), sys.stdout, indent=1, sort_keys=True)
    sys.stdout.write("\n")
