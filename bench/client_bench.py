"""RemoteTables over loopback against the run command's server, side by side with in-process
ComponentTables on the same queries (issue 13.5).

    python bench/client_bench.py [--port 8104] [--threads 1]

Starts from an empty scratch folder as ``bash scripts/run.sh`` does (migrate, import the shipped
bundles, gunicorn with 2 workers, gthread, keep-alive), then measures on the H200 Qwen3-30B-A3B
bf16 bundles named by hardware + model + variant, target TP1/DP2 rank 0 (the registry picks
the best vLLM-native bundle for it, whose shipped folder is opened in process):
  - 1 query per call: ``time_us`` over 3,000 distinct queries (in process: the same calls,
    the scalar cache cleared first);
  - 10,000 queries per call: ``answer`` and ``batch`` (experts), 30 calls each;
  - the raw REST figure on the same machine: bench/registry_load.py posting the same
    10,000-query body (what RemoteTables' 10,000-query call should stay within 2x of);
  - cold start: a new RemoteTables with an empty cache_dir to its first answer (resolve,
    download, check, load); cached start: a new RemoteTables over the filled cache, online
    (resolve, ETag-confirmed 304, load) and offline (load only), each to its first answer.
Prints a Markdown table (median and p90 of each) and the raw JSON lines.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "bench")]

from registry_bench import load, lookup_queries, manage, wait_ready

from moetables import ComponentTables
from moetables.client import RemoteTables, manifest_sha256

NAME = {"hardware": "H200", "model": "Qwen/Qwen3-30B-A3B-Instruct-2507", "variant": "bf16"}
TARGET = (1, 2, 0)


def timed(fn: Any, repeat: int) -> list[float]:
    out = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        out.append((time.perf_counter() - start) * 1000)
    return out


def row(name: str, samples: list[float], unit_calls: int = 1) -> dict[str, Any]:
    ordered = sorted(samples)
    return {
        "name": name,
        "calls": len(samples) * unit_calls,
        "p50_ms": round(statistics.median(ordered), 4),
        "p90_ms": round(ordered[int(0.9 * (len(ordered) - 1))], 4),
        "calls_per_s": round(len(samples) * unit_calls / (sum(samples) / 1000), 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description="RemoteTables benchmarks")
    parser.add_argument("--port", type=int, default=8104)
    parser.add_argument("--threads", type=int, default=1, help="gthread threads per worker")
    args = parser.parse_args()

    scratch = Path(tempfile.mkdtemp(prefix="client-bench-"))
    # DJANGO_DEBUG=0 is production: it needs its own key; plain HTTP on loopback.
    env = {
        **os.environ,
        "REGISTRY_VAR_DIR": str(scratch),
        "DJANGO_DEBUG": "0",
        "DJANGO_LOG_LEVEL": "WARNING",
        "DJANGO_SECRET_KEY": secrets.token_urlsafe(50),
        "DJANGO_HTTPS": "0",
    }
    env.pop("DATABASE_URL", None)
    server = None
    try:
        manage(env, "migrate", "--noinput")
        manage(env, "import_bundle", "bundles")
        bind = f"127.0.0.1:{args.port}"
        server = subprocess.Popen(
            [
                str(REPO / ".venv" / "bin" / "gunicorn"),
                "--bind",
                bind,
                "--workers",
                "2",
                "--worker-class",
                "gthread",
                "--threads",
                str(args.threads),
                "--log-level",
                "warning",
                "config.wsgi",
            ],
            cwd=REPO,
            env=env,
        )
        url = f"http://{bind}"
        wait_ready(url + "/api/v1/", server)
        results: list[dict[str, Any]] = []

        singles = lookup_queries(3000, seed=21)
        batch = lookup_queries(10_000, seed=7)
        experts = [q for q in batch if q["component"] == "experts"]
        cols = [
            [q[k] for q in experts] for k in ("tokens", "activated_experts", "local_assignments")
        ]

        remote_tables = RemoteTables(url, **NAME)
        remote = remote_tables.deployment(*TARGET)
        # in process: the shipped folder of the bundle the registry chose
        folder = next(
            m.parent
            for m in sorted((REPO / "bundles").glob("*/**/meta.yaml"))
            if manifest_sha256(m.parent) == remote.answerer["sha256"]
        )
        print(f"answered by {folder.relative_to(REPO)}: {remote.answerer}")
        local = ComponentTables(folder).deployment(*TARGET)
        assert remote.answer(batch) == local.answer(batch)  # the same answers, bit for bit

        def scalars(deployment: Any) -> None:
            for q in singles:
                try:
                    deployment.time_us(
                        q["component"],
                        q["tokens"],
                        q.get("activated_experts", -1),
                        q.get("local_assignments", -1),
                    )
                except (LookupError, ValueError):
                    pass

        local.time_us.cache_clear()
        results.append(
            row(
                "in process: 1 query per call (time_us)",
                [t / len(singles) for t in timed(lambda: scalars(local), 1)],
            )
        )
        remote._scalars.clear()
        per_call = timed(lambda: scalars(remote), 1)[0] / len(singles)
        results.append(row("RemoteTables: 1 query per call (time_us)", [per_call]))
        # per-call latency distribution of the remote scalar path
        probe = singles[:1000]
        samples = []
        for q in probe:
            start = time.perf_counter()
            remote.answer([q])
            samples.append((time.perf_counter() - start) * 1000)
        results.append(row("RemoteTables: 1 query per call (answer([q]), each timed)", samples))

        results.append(
            row(
                "in process: 10,000 queries per call (answer)",
                timed(lambda: local.answer(batch), 30),
            )
        )
        results.append(
            row(
                "RemoteTables: 10,000 queries per call (answer)",
                timed(lambda: remote.answer(batch), 30),
            )
        )
        results.append(
            row(
                f"in process: {len(experts)} expert queries per call (batch)",
                timed(lambda: local.batch("experts", *cols), 30),
            )
        )
        results.append(
            row(
                f"RemoteTables: {len(experts)} expert queries per call (batch)",
                timed(lambda: remote.batch("experts", *cols), 30),
            )
        )

        body = scratch / "lookup-10k.json"
        body.write_text(
            json.dumps({**NAME, "target": {"tp": 1, "dp": 2, "rank": 0}, "queries": batch})
        )
        raw = load(url, "/api/v1/lookup", body, 30, 1)
        results.append(
            {
                "name": "raw REST: 10,000 queries per request (registry_load.py)",
                "calls": raw["requests"],
                "p50_ms": raw["p50_ms"],
                "p90_ms": raw["p90_ms"],
                "calls_per_s": raw["requests_per_s"],
            }
        )

        def start(cache: Path, offline: bool) -> None:
            tables = RemoteTables(url, **NAME, cache_dir=cache, offline=offline)
            tables.deployment(*TARGET).time_us("gate_routing", 7)
            tables.close()

        cold = []
        for i in range(5):
            cache = scratch / f"cache-{i}"
            cold += timed(lambda cache=cache: start(cache, False), 1)  # type: ignore[misc]
        results.append(row("cold start: empty cache_dir to first answer (download)", cold))
        cache = scratch / "cache-0"
        results.append(
            row(
                "cached start, online: resolve + 304 + load to first answer",
                timed(lambda: start(cache, False), 10),
            )
        )
        results.append(
            row(
                "cached start, offline: load to first answer", timed(lambda: start(cache, True), 10)
            )
        )

        print(
            f"\n| scenario (SQLite, {args.threads} thread(s) per worker) | calls | p50 ms "
            "| p90 ms | calls/s |"
        )
        print("| --- | --- | --- | --- | --- |")
        for r in results:
            print(
                f"| {r['name']} | {r['calls']} | {r['p50_ms']} | {r['p90_ms']} | "
                f"{r['calls_per_s']} |"
            )
        print()
        for r in results:
            print(json.dumps(r))
        remote_tables.close()
    finally:
        if server is not None and server.poll() is None:
            server.terminate()
            server.wait(timeout=30)
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
