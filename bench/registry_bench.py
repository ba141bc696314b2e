"""The registry benchmarks: gunicorn (2 workers) on loopback, bench/registry_load.py as client.

    python bench/registry_bench.py                       # SQLite, the run command's default
    python bench/registry_bench.py --postgres            # a scratch PostgreSQL database
    python bench/registry_bench.py --threads 1           # one thread per gunicorn worker

Each run starts from an empty database in a scratch folder: migrate, import the shipped bundle,
publish 1,000 SYNTHETIC bundles (bench/registry_synthetic.py), start gunicorn (2 workers,
gthread, 2 threads each unless --threads says otherwise, keep-alive), then measure:
  - POST /api/v1/lookup with 10,000 queries per request   (target p50 <= 50 ms), on the shipped
    historical bundle and on a current-layout SYNTHETIC one
  - POST /api/v1/lookup with 1 query per request          (target p50 <= 3 ms, >= 1,000 req/s)
  - GET /api/v1/bundles/ over 1,001 bundles               (target <= 100 ms)
and, as the machine's ceiling, the same gunicorn serving bench/registry_baseline_wsgi.py.
Prints a Markdown table of the results and the raw JSON lines.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
PY = str(REPO / ".venv" / "bin" / "python")
PG_ADMIN = "postgres://postgres@127.0.0.1:5432/postgres"
PG_BENCH = "registry_bench"


def lookup_queries(count: int, seed: int = 7) -> list[dict[str, Any]]:
    """A mix over the shipped bundle's rank-0 table (E=128, k=8, L=64: balanced M = 4N)."""
    rng = random.Random(seed)
    queries: list[dict[str, Any]] = []
    for _ in range(count):
        kind = rng.random()
        if kind < 0.25:
            queries.append({"component": "gate_routing", "tokens": rng.randint(1, 2048)})
        elif kind < 0.4:
            queries.append({"component": "finalize_copy", "tokens": rng.randint(1, 2048)})
        else:
            n = rng.randint(1, 4096)
            m = 4 * n
            queries.append(
                {
                    "component": "experts",
                    "tokens": n,
                    "activated_experts": rng.randint(1, min(64, m)),
                    "local_assignments": m,
                }
            )
    return queries


def current_queries(count: int, seed: int = 11) -> list[dict[str, Any]]:
    """A mix over a SYNTHETIC current-layout TP1/DP2 table (E=16, k=2, L=8)."""
    rng = random.Random(seed)
    queries: list[dict[str, Any]] = []
    for _ in range(count):
        if rng.random() < 0.3:
            queries.append({"component": "gate_routing", "tokens": rng.randint(1, 64)})
            continue
        n = rng.randint(2, 128)
        a = rng.randint(1, min(8, 2 * n))
        m = rng.randint(a, n * min(2, a))
        queries.append(
            {
                "component": "experts",
                "tokens": n,
                "activated_experts": a,
                "local_assignments": m,
            }
        )
    return queries


def scratch_postgres() -> str:
    import psycopg

    with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {PG_BENCH}")
        conn.execute(f"CREATE DATABASE {PG_BENCH}")
    return f"postgres://postgres@127.0.0.1:5432/{PG_BENCH}"


def drop_postgres() -> None:
    import psycopg

    with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {PG_BENCH} WITH (FORCE)")


def manage(env: dict[str, str], *args: str) -> None:
    subprocess.run(
        [PY, "manage.py", *args], cwd=REPO, env=env, check=True, stdout=subprocess.DEVNULL
    )


def wait_ready(url: str, proc: subprocess.Popen[bytes]) -> None:
    for _ in range(200):
        if proc.poll() is not None:
            raise SystemExit("gunicorn exited")
        try:
            urllib.request.urlopen(url, timeout=1).read()
            return
        except OSError:
            time.sleep(0.1)
    raise SystemExit("gunicorn did not answer")


def load(
    base: str, path: str, body: Path | None, requests: int, concurrency: int
) -> dict[str, Any]:
    cmd = [
        PY,
        str(REPO / "bench" / "registry_load.py"),
        "--url",
        base + path,
        "--requests",
        str(requests),
        "--concurrency",
        str(concurrency),
    ]
    if body is not None:
        cmd += ["--body-file", str(body)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    result: dict[str, Any] = json.loads(out)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description="registry benchmarks")
    parser.add_argument("--postgres", action="store_true")
    parser.add_argument("--bundles", type=int, default=1000)
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--threads", type=int, default=2, help="gthread threads per worker")
    args = parser.parse_args()

    scratch = Path(tempfile.mkdtemp(prefix="registry-bench-"))
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
    if args.postgres:
        env["DATABASE_URL"] = scratch_postgres()
    server = baseline = None
    try:
        manage(env, "migrate", "--noinput")
        manage(env, "import_bundle", "bundles")
        subprocess.run(
            [PY, str(REPO / "bench" / "registry_synthetic.py"), "--count", str(args.bundles)],
            cwd=REPO,
            env=env,
            check=True,
        )
        target = {"tp": 1, "dp": 2, "rank": 0, "sequence_parallel": False}
        shipped = {
            "hardware": "RTXPRO6000",
            "model": "Qwen/Qwen3-30B-A3B-Instruct-2507",
            "variant": "bf16",
            "target": target,
        }
        synthetic = {
            "hardware": "SYNTHETIC-BENCH-1",
            "model": "synthetic/bench-moe-0001",
            "variant": "fp8",
            "target": target,
        }
        bodies = {}
        for name, envelope, queries in (
            ("1", shipped, lookup_queries(1)),
            ("10k", shipped, lookup_queries(10_000)),
            ("10k-current", synthetic, current_queries(10_000)),
        ):
            path = scratch / f"lookup-{name}.json"
            path.write_text(json.dumps({**envelope, "queries": queries}))
            bodies[name] = path
        bind = f"127.0.0.1:{args.port}"
        gunicorn = [
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
        ]
        baseline = subprocess.Popen(
            [*gunicorn, "registry_baseline_wsgi:app"], cwd=REPO / "bench", env=env
        )
        base = f"http://{bind}"
        wait_ready(base + "/", baseline)
        results = []
        for concurrency in (1, 4):
            result = load(base, "/", None, 3000, concurrency)
            result["name"] = "baseline: smallest WSGI app on the same gunicorn"
            results.append(result)
        baseline.terminate()
        baseline.wait(timeout=30)
        server = subprocess.Popen([*gunicorn, "config.wsgi"], cwd=REPO, env=env)
        wait_ready(base + "/api/v1/", server)
        scenarios = [
            (
                "lookup, 10,000 queries per request (shipped historical bundle)",
                "/api/v1/lookup",
                bodies["10k"],
                30,
                1,
            ),
            (
                "lookup, 10,000 queries per request (SYNTHETIC current-layout bundle)",
                "/api/v1/lookup",
                bodies["10k-current"],
                60,
                1,
            ),
            ("lookup, 1 query per request", "/api/v1/lookup", bodies["1"], 3000, 1),
            ("lookup, 1 query per request", "/api/v1/lookup", bodies["1"], 6000, 4),
            (
                f"bundle list, {args.bundles + 1} bundles, default page (50)",
                "/api/v1/bundles/",
                None,
                300,
                1,
            ),
            (
                f"bundle list, {args.bundles + 1} bundles, filtered tp=2&dp=2",
                "/api/v1/bundles/?tp=2&dp=2",
                None,
                300,
                1,
            ),
            (
                f"bundle list, {args.bundles + 1} bundles, limit=1000",
                "/api/v1/bundles/?limit=1000",
                None,
                30,
                1,
            ),
        ]
        for name, path, body, requests, concurrency in scenarios:
            result = load(base, path, body, requests, concurrency)
            result["name"] = name
            results.append(result)
        database = "PostgreSQL 127.0.0.1" if args.postgres else "SQLite"
        database += f", {args.threads} thread{'s' if args.threads != 1 else ''} per worker"
        print(
            f"\n| scenario ({database}) | requests | concurrency | p50 ms | p90 ms | p99 ms "
            "| req/s | errors |"
        )
        print("| --- | --- | --- | --- | --- | --- | --- | --- |")
        for r in results:
            print(
                f"| {r['name']} | {r['requests']} | {r['concurrency']} | {r['p50_ms']} | "
                f"{r['p90_ms']} | {r['p99_ms']} | {r['requests_per_s']} | {r['errors']} |"
            )
        print()
        for r in results:
            print(json.dumps(r))
    finally:
        for process in (baseline, server):
            if process is not None and process.poll() is None:
                process.terminate()
                process.wait(timeout=30)
        if args.postgres:
            drop_postgres()
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
