"""Where a 10,000-query lookup spends its time, in one process, without HTTP.

    python bench/registry_lookup_breakdown.py

Times the parts of POST /api/v1/lookup separately: JSON decoding of the request body,
moetables' DeploymentTables.answer (the lookups themselves), and JSON encoding of the
answers; for the shipped historical bundle and a SYNTHETIC current-layout one. Decoding and
encoding are timed with orjson, as the endpoint does them, and with the json module (as DRF's
parser and renderer do) for comparison. Prints the median of 5 runs of each, in milliseconds.
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import orjson
from registry_bench import current_queries, lookup_queries
from registry_synthetic import synthetic_specs

from moetables import write_bundle
from moetables.lookup import ComponentTables

SHIPPED = (
    Path(__file__).resolve().parents[1]
    / "bundles/llmservingsim-rtxpro6000/Qwen/Qwen3-30B-A3B-Instruct-2507/bf16"
)


def median_ms(action: Callable[[], Any], runs: int = 5) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        action()
        times.append((time.perf_counter() - start) * 1000)
    return round(statistics.median(times), 1)


def main() -> None:
    with tempfile.TemporaryDirectory() as work:
        synthetic = write_bundle(
            Path(work) / "synthetic" / "fp8",
            {
                "hardware": "SYNTHETIC-BENCH-1",
                "model": "synthetic/bench-moe-0001",
                "variant": "fp8",
            },
            synthetic_specs(1, 1, 2),
        )
        for name, root, queries in (
            ("shipped historical bundle", SHIPPED, lookup_queries(10_000)),
            ("SYNTHETIC current-layout bundle", synthetic, current_queries(10_000)),
        ):
            deployment = ComponentTables(root).deployment(1, 2, 0)
            body = json.dumps({"queries": queries}).encode()
            answers = deployment.answer(queries)
            print(
                f"{name}: decode {median_ms(lambda b=body: orjson.loads(b))} ms "
                f"(json {median_ms(lambda b=body: json.loads(b))} ms), "
                f"answer {median_ms(lambda d=deployment, q=queries: d.answer(q))} ms, "
                f"encode {median_ms(lambda a=answers: orjson.dumps({'answers': a}))} ms "
                f"(json {median_ms(lambda a=answers: json.dumps({'answers': a}))} ms)"
            )


if __name__ == "__main__":
    main()
