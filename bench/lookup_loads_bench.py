"""Issue 18: in-process cost of described lookup queries against plain ones (F2 DP2 rank 0).

    PYTHONPATH=. .venv/bin/python bench/lookup_loads_bench.py

10,000 expert queries (N in 1,024..4,096, A = 64, M = 4N), answered by ``answer`` three times:
plain, then the same with ``loads`` uniform / power_law(1.2) (tile_cost_us 1.6) / balanced /
64 explicit counts.
"""

import random
import statistics
import time

from moetables import ComponentTables
from moetables.tiles import balanced_counts

t = ComponentTables(
    "bundles/H200-vllm-modular-f2/Qwen/Qwen3-30B-A3B-Instruct-2507/bf16"
).deployment(1, 2, 0)
rng = random.Random(3)
plain: list[dict[str, object]] = []
for _ in range(10000):
    n = rng.randint(1024, 4096)
    plain.append(
        {"component": "experts", "tokens": n, "activated_experts": 64, "local_assignments": 4 * n}
    )


def moved(query: dict[str, object]) -> list[int]:
    """The balanced counts of the query with one pair moved between two experts."""
    m = query["local_assignments"]
    assert isinstance(m, int)
    counts: list[int] = balanced_counts(m, 64).tolist()
    counts[0] += 1
    counts[1] -= 1
    return counts


for name, qs in [
    ("plain", plain),
    ("uniform", [{**q, "loads": "uniform", "tile_cost_us": 1.6} for q in plain]),
    ("power_law(1.2)", [{**q, "loads": "power_law(1.2)", "tile_cost_us": 1.6} for q in plain]),
    ("balanced", [{**q, "loads": "balanced"} for q in plain]),
    ("64 counts", [{**q, "loads": moved(q), "tile_cost_us": 1.6} for q in plain]),
]:
    runs: list[float] = []
    for _ in range(3):
        s = time.perf_counter()
        a = t.answer(qs)
        runs.append(time.perf_counter() - s)
    print(
        name,
        f"first {runs[0] * 1e3:.1f} ms, then {statistics.median(runs[1:]) * 1e3:.1f} ms per 10,000",
        sum("time_us" in x for x in a),
    )
