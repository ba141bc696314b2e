"""Time and memory of refusing the hostile inputs of issue 17, item 4 (moetables alone).

    python bench/limits_cost.py

Each case is a meta.yaml (or a contract) at or past a limit, read by
`moetables.bundle.validate_bundle` as publication reads it; measured: wall time (best of 3)
and the peak of Python allocations (tracemalloc, a separate run).
"""

from __future__ import annotations

import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from moetables.bundle import validate_bundle
from tests.moetables.test_bounded_yaml import LAUGHS

VALID_HEAD = b"hardware: X\nmodel: m\nvariant: v\n"


def cases() -> dict[str, bytes]:
    return {
        "billion laughs (444 B, aliases)": LAUGHS,
        "4 MiB of YAML in one string (at the size limit)": VALID_HEAD
        + b"notes: '"
        + b"x" * (4 * 1024 * 1024 - 50)
        + b"'\n",
        "4.5 MiB of YAML (past the size limit)": VALID_HEAD
        + b"n: '"
        + b"x" * (4608 * 1024)
        + b"'\n",
        "99,990 nodes (at the node limit)": VALID_HEAD + b"n: [" + b"1," * 99_980 + b"1]\n",
        "100,001 nodes (past the node limit)": VALID_HEAD + b"n: [" + b"1," * 100_000 + b"1]\n",
        "100,000 nested [ (depth attack)": VALID_HEAD
        + b"n: "
        + b"[" * 100_000
        + b"]" * 100_000
        + b"\n",
        "65 levels (past the depth limit)": VALID_HEAD + b"n: " + b"[" * 65 + b"]" * 65 + b"\n",
        "global_experts 50,000,000": VALID_HEAD
        + (
            b"per_tp:\n  1:\n    moe_components:\n      schema: moe-components\n"
            b"      entries:\n      - target: {tp: 1, dp: 1, ep: 1, rank: 0, "
            b"sequence_parallel: false}\n        table: t.csv\n        contract: {target: {tp: 1,"
            b" dp: 1, ep: 1, rank: 0, sequence_parallel: false}, global_experts: 50000000, "
            b"global_top_k: 2, local_experts: 50000000, components: [experts], modes: [eager]}\n"
        ),
    }


def main() -> None:
    print("| input | refused in | peak Python memory | first problem |")
    print("| --- | --- | --- | --- |")
    with tempfile.TemporaryDirectory() as tmp:
        for name, data in cases().items():
            folder = Path(tmp) / "b"
            folder.mkdir(exist_ok=True)
            (folder / "meta.yaml").write_bytes(data)
            best, problem = float("inf"), ""
            for _ in range(3):  # time without tracemalloc, which slows Python severalfold
                start = time.perf_counter()
                report = validate_bundle(folder)
                best = min(best, time.perf_counter() - start)
                problem = (report.problems or ["accepted"])[0]
            tracemalloc.start()
            validate_bundle(folder)
            peak = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
            print(f"| {name} | {best * 1000:.1f} ms | {peak / 2**20:.1f} MiB | {problem[:90]} |")


if __name__ == "__main__":
    main()
