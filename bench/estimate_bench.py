"""Layer-estimate speed beside plain component lookups of the same steps (issue 11, item 6).

    python bench/estimate_bench.py                 # everything: in process, CLI, REST
    python bench/estimate_bench.py --skip-rest     # in process and CLI only
    python bench/estimate_bench.py --rest-only --port 8114   # the REST figures only

Steps: random padded token counts in [1, 2048] per DP rank (seed 7) on the shipped H200 bundle's
TP1/DP2/EP2 deployment (both ranks), balanced routing unless stated. Each estimate is one MoE
layer: routing, 6 component lookups (gate_routing, experts, finalize_copy on both ranks), the
block trace with 4 collectives and the worst-rank timing. The "plain lookups" rows answer the
same 6 lookups per step (the N, A, M the routing gave) without routing or trace, as a
simulator would have to do itself otherwise. The cluster is the TEST FIXTURE
(tests/moetables/data/cluster-fixture.yaml): only the speed is measured here, and the link
model's arithmetic costs the same whatever its numbers.

REST runs gunicorn (2 workers, gthread, 1 thread each) on 127.0.0.1 (port 8102 by default) over
a scratch SQLite registry with the shipped H200 bundle imported (alone: the H200 vllm-live and
torch-reference bundles carry the same hardware, model and variant names), and bench/registry_load.py as the
client (concurrency 1).
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

import numpy as np
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from moetables import ComponentTables
from moetables.comm import load_cluster
from moetables.profiles import read_profile
from moetables.routing import Deployment, route_batch

PY = str(REPO / ".venv" / "bin" / "python")
H200 = REPO / "bundles/H200/Qwen/Qwen3-30B-A3B-Instruct-2507/bf16"
FIXTURE = REPO / "tests/moetables/data/cluster-fixture.yaml"
COMPONENTS = ("gate_routing", "experts", "finalize_copy")


def steps(count: int, seed: int = 7) -> np.ndarray:
    return np.random.default_rng(seed).integers(1, 2049, size=(count, 2))


def best(fn: Any, repeat: int = 3) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def lookup_queries(tables: ComponentTables, counts: np.ndarray) -> list[list[dict[str, Any]]]:
    """The 6 component lookups per step, per rank (the routing's N, A, M)."""
    d = tables.deployment(1, 2, 0)
    g = d.entry.geometry

    r = route_batch(Deployment(1, 2, False, g.global_experts, g.top_k), counts, "balanced")
    per_rank: list[list[dict[str, Any]]] = [[], []]
    for i in range(counts.shape[0]):
        for rank in (0, 1):
            rows = int(r.local_rows[i, rank])
            per_rank[rank] += [
                {"component": "gate_routing", "tokens": rows},
                {
                    "component": "experts",
                    "tokens": int(r.tokens[i]),
                    "activated_experts": int(r.activated_experts[i, rank]),
                    "local_assignments": int(r.local_assignments[i, rank]),
                },
                {"component": "finalize_copy", "tokens": rows},
            ]
    return per_rank


def seeded_draws(count: int) -> list[dict[str, Any]]:
    """The policies that draw per token (random; captured from the shipped normal_routing
    profile, layer 0), whose cost grows with N x E per step, unlike the counting ones."""
    tables = ComponentTables(H200)
    cluster = load_cluster(FIXTURE)
    counts = steps(count)
    profile = read_profile(REPO / "docs/evidence/h200-routing/normal_routing.routing.npz")
    tables.estimate_batch(counts[:10], tp=1, dp=2, cluster=cluster)  # load both ranks
    cases: list[tuple[str, dict[str, Any]]] = [
        # Uncharged arms as recorded in docs/benchmarks.md; the charged one beside them (the
        # estimate's default since session 11, "auto", is "table" on these tables).
        ("random", {"policy": "random", "tile_cost_us": "none"}),
        ("random, tile_cost_us='table'", {"policy": "random", "tile_cost_us": "table"}),
        (
            "captured (normal_routing, layer 0)",
            {"policy": "captured", "profile": profile, "tile_cost_us": "none"},
        ),
    ]
    out = []
    for name, options in cases:
        options = {"layer": 0, **options} if options["policy"] == "captured" else options
        seconds = best(
            lambda o=options: tables.estimate_batch(counts, tp=1, dp=2, cluster=cluster, **o)
        )
        out.append(
            {
                "name": f"estimate_batch, {count:,} steps, {name}, fixture cluster",
                "steps_per_s": count / seconds,
                "seconds": seconds,
            }
        )
    return out


def in_process(count: int) -> list[dict[str, Any]]:
    tables = ComponentTables(H200)
    cluster = load_cluster(FIXTURE)
    counts = steps(count)
    tables.estimate_batch(counts[:100], tp=1, dp=2, cluster=cluster)  # load both ranks
    out = []
    for policy in ("balanced", "round_robin"):
        seconds = best(
            lambda p=policy: tables.estimate_batch(
                counts, tp=1, dp=2, cluster=cluster, policy=p, tile_cost_us="none"
            )
        )
        out.append(
            {
                "name": f"estimate_batch, {count:,} steps, {policy}, fixture cluster",
                "steps_per_s": count / seconds,
                "seconds": seconds,
            }
        )
    seconds = best(lambda: tables.estimate_batch(counts, tp=1, dp=2))
    out.append(
        {
            "name": f"estimate_batch, {count:,} steps, balanced, no cluster",
            "steps_per_s": count / seconds,
            "seconds": seconds,
        }
    )
    # Plain lookups of the same steps: the routing's N/A/M, 6 batch lookups of `count` rows.
    g = tables.deployment(1, 2, 0).entry.geometry

    r = route_batch(Deployment(1, 2, False, g.global_experts, g.top_k), counts, "balanced")
    ranks = [tables.deployment(1, 2, rank) for rank in (0, 1)]

    def lookups() -> None:
        for rank, d in enumerate(ranks):
            d.batch("gate_routing", r.local_rows[:, rank])
            d.batch("experts", r.tokens, r.activated_experts[:, rank], r.local_assignments[:, rank])
            d.batch("finalize_copy", r.local_rows[:, rank])

    seconds = best(lookups)
    out.append(
        {
            "name": f"plain batch lookups of the same steps (6 per step, {count:,} steps)",
            "steps_per_s": count / seconds,
            "seconds": seconds,
        }
    )
    # One step at a time: the typed result with its events, and 6 scalar lookups.
    few = counts[:2000].tolist()
    seconds = best(lambda: [tables.estimate(s, tp=1, dp=2, cluster=cluster) for s in few], 2)
    out.append(
        {
            "name": "estimate, one step per call (typed result with events), 2,000 steps",
            "steps_per_s": len(few) / seconds,
            "seconds": seconds,
        }
    )
    queries = lookup_queries(tables, counts[:2000])

    def scalar() -> None:
        for rank, d in enumerate(ranks):
            for q in queries[rank]:
                d.time_us(
                    q["component"],
                    q["tokens"],
                    q.get("activated_experts", -1),
                    q.get("local_assignments", -1),
                )

    d0 = ranks[0]
    d0.time_us.cache_clear()
    ranks[1].time_us.cache_clear()
    seconds = best(scalar, 1)  # the first pass is uncached, as distinct steps are
    out.append(
        {
            "name": "plain scalar lookups, 6 per step (uncached), 2,000 steps",
            "steps_per_s": len(few) / seconds,
            "seconds": seconds,
        }
    )
    return out


def run_cli(args: list[str], stdin: Any = None) -> float:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    t0 = time.perf_counter()
    subprocess.run(
        [PY, "-m", "moetables", *args],
        cwd=REPO,
        env=env,
        check=True,
        stdout=subprocess.DEVNULL,
        stdin=stdin,
    )
    return time.perf_counter() - t0


def cli(scratch: Path, count: int) -> list[dict[str, Any]]:
    base = ["estimate", str(H200), "--tp", "1", "--dp", "2", "--cluster", str(FIXTURE)]
    out = []
    one = statistics.median(run_cli([*base, "--tokens", "5,300"]) for _ in range(5))
    out.append(
        {
            "name": "CLI estimate, one step (process start included), median of 5",
            "steps_per_s": 1 / one,
            "seconds": one,
        }
    )
    tables = ComponentTables(H200)
    q1 = lookup_queries(tables, np.array([[5, 300]]))
    files = []
    for rank in (0, 1):
        path = scratch / f"one-{rank}.jsonl"
        path.write_text("\n".join(json.dumps(q) for q in q1[rank]) + "\n")
        files.append(path)
    one = statistics.median(
        sum(
            run_cli(
                [
                    "lookup",
                    str(H200),
                    "--tp",
                    "1",
                    "--dp",
                    "2",
                    "--rank",
                    str(rank),
                    "--queries",
                    str(files[rank]),
                ]
            )
            for rank in (0, 1)
        )
        for _ in range(5)
    )
    out.append(
        {
            "name": "CLI lookup of the same step: 2 invocations (one per rank), 3 queries "
            "each, median of 5",
            "steps_per_s": 1 / one,
            "seconds": one,
        }
    )
    counts = steps(count)
    path = scratch / "steps.jsonl"
    path.write_text("\n".join(json.dumps(row) for row in counts.tolist()) + "\n")
    seconds = run_cli([*base, "--tokens", str(path)])
    out.append(
        {
            "name": f"CLI estimate, JSONL file of {count:,} steps (full answers with events)",
            "steps_per_s": count / seconds,
            "seconds": seconds,
        }
    )
    seconds = run_cli([*base, "--tokens", str(path), "--no-events"])
    out.append(
        {
            "name": f"CLI estimate, JSONL file of {count:,} steps, --no-events",
            "steps_per_s": count / seconds,
            "seconds": seconds,
        }
    )
    queries = lookup_queries(tables, counts)
    total = 0.0
    for rank in (0, 1):
        qpath = scratch / f"queries-{rank}.jsonl"
        qpath.write_text("\n".join(json.dumps(q) for q in queries[rank]) + "\n")
        total += run_cli(
            [
                "lookup",
                str(H200),
                "--tp",
                "1",
                "--dp",
                "2",
                "--rank",
                str(rank),
                "--queries",
                str(qpath),
            ]
        )
    out.append(
        {
            "name": f"CLI lookup of the same {count:,} steps: 2 invocations of "
            f"{3 * count:,} queries",
            "steps_per_s": count / total,
            "seconds": total,
        }
    )
    return out


def wait_ready(url: str, proc: subprocess.Popen[bytes]) -> None:
    import urllib.error
    import urllib.request

    for _ in range(300):
        if proc.poll() is not None:
            raise SystemExit("gunicorn exited")
        try:
            urllib.request.urlopen(url, timeout=1).read()
            return
        except urllib.error.HTTPError:
            return  # it answered (the API root may ask for credentials)
        except OSError:
            time.sleep(0.1)
    raise SystemExit("gunicorn did not answer")


def load(url: str, body: Path, requests: int) -> dict[str, Any]:
    cmd = [
        PY,
        str(REPO / "bench" / "registry_load.py"),
        "--url",
        url,
        "--body-file",
        str(body),
        "--requests",
        str(requests),
        "--concurrency",
        "1",
    ]
    result: dict[str, Any] = json.loads(
        subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    )
    return result


def rest(scratch: Path, port: int) -> list[dict[str, Any]]:
    # A production-mode (DEBUG off) scratch server needs its own secret key and, on plain HTTP,
    # DJANGO_HTTPS=0 (config/settings.py).
    env = {
        **os.environ,
        "REGISTRY_VAR_DIR": str(scratch / "var"),
        "DJANGO_DEBUG": "0",
        "DJANGO_LOG_LEVEL": "WARNING",
        "DJANGO_SECRET_KEY": secrets.token_urlsafe(50),
        "DJANGO_HTTPS": "0",
    }  # plain HTTP on loopback: no redirect to TLS
    env.pop("DATABASE_URL", None)
    for args in (["migrate", "--noinput"], ["import_bundle", "bundles/H200"]):
        subprocess.run(
            [PY, "manage.py", *args], cwd=REPO, env=env, check=True, stdout=subprocess.DEVNULL
        )
    cluster = yaml.safe_load(FIXTURE.read_text())
    named = {"hardware": "H200", "model": "Qwen/Qwen3-30B-A3B-Instruct-2507", "variant": "bf16"}
    tables = ComponentTables(H200)
    bodies = {}
    for name, count in (("1", 1), ("1000", 1000)):
        counts = steps(count, seed=11)
        est: dict[str, Any] = {**named, "tp": 1, "dp": 2, "cluster": cluster}
        if count == 1:
            est["tokens"] = counts[0].tolist()
        else:
            est["steps"] = counts.tolist()
        bodies[f"estimate-{name}"] = est
        bodies[f"estimate-{name}-lean"] = {**est, "events": False}
        queries = lookup_queries(tables, counts)
        for rank in (0, 1):
            bodies[f"lookup-{name}-{rank}"] = {
                **named,
                "target": {"tp": 1, "dp": 2, "rank": rank},
                "queries": queries[rank],
            }
    paths = {}
    for key, body in bodies.items():
        paths[key] = scratch / f"{key}.json"
        paths[key].write_text(json.dumps(body))
    bind = f"127.0.0.1:{port}"
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
            "1",
            "--log-level",
            "warning",
            "config.wsgi",
        ],
        cwd=REPO,
        env=env,
    )
    out = []
    try:
        base = f"http://{bind}/api/v1/"
        wait_ready(base, server)
        for name, requests, steps_each in (("1", 1000, 1), ("1000", 30, 1000)):
            r = load(base + "estimate", paths[f"estimate-{name}"], requests)
            out.append(
                {
                    "name": f"REST estimate, {steps_each} step(s) per request",
                    "steps_per_s": steps_each * r["requests_per_s"],
                    "p50_ms": r["p50_ms"],
                    "errors": r["errors"],
                }
            )
            r = load(base + "estimate", paths[f"estimate-{name}-lean"], requests)
            out.append(
                {
                    "name": f'REST estimate, {steps_each} step(s) per request, "events": false',
                    "steps_per_s": steps_each * r["requests_per_s"],
                    "p50_ms": r["p50_ms"],
                    "errors": r["errors"],
                }
            )
            p50 = 0.0
            per_s = 0.0
            for rank in (0, 1):
                r = load(base + "lookup", paths[f"lookup-{name}-{rank}"], requests)
                p50 += r["p50_ms"]
                per_s += 1 / r["requests_per_s"]
            out.append(
                {
                    "name": f"REST lookup of the same steps: 2 requests (one per rank) of "
                    f"{3 * steps_each} queries",
                    "steps_per_s": steps_each / per_s,
                    "p50_ms": round(p50, 3),
                    "errors": r["errors"],
                }
            )
        out += remote_tables(f"http://{bind}", cluster)
    finally:
        server.terminate()
        server.wait(timeout=30)
    return out


def remote_tables(url: str, cluster_raw: dict[str, Any]) -> list[dict[str, Any]]:
    """The Python client: typed results rebuilt from the answers (events included)."""
    try:
        from moetables.client import RemoteTables
    except ImportError:
        return []
    if not hasattr(RemoteTables, "estimate"):  # a tree from before the client's estimate
        return []
    from moetables.comm import parse_cluster

    cluster = parse_cluster(cluster_raw, source=str(FIXTURE))
    named: dict[str, Any] = {
        "hardware": "H200",
        "model": "Qwen/Qwen3-30B-A3B-Instruct-2507",
        "variant": "bf16",
    }
    out = []
    with RemoteTables(url, **named) as tables:
        one = steps(200, seed=11)
        tables.estimate(one[0].tolist(), tp=1, dp=2, cluster=cluster)  # pins the bundle
        t = best(
            lambda: [tables.estimate(row, tp=1, dp=2, cluster=cluster) for row in one.tolist()],
            repeat=2,
        )
        out.append(
            {
                "name": "RemoteTables.estimate, 1 step per call (typed LayerEstimate)",
                "steps_per_s": 200 / t,
            }
        )
        many = steps(10_000, seed=11)
        t = best(lambda: tables.estimate_batch(many, tp=1, dp=2, cluster=cluster), repeat=2)
        out.append(
            {
                "name": "RemoteTables.estimate_batch, 10,000 steps (1,000 per request, "
                "typed BatchEstimate)",
                "steps_per_s": 10_000 / t,
            }
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100_000)
    parser.add_argument("--cli-steps", type=int, default=10_000)
    parser.add_argument("--port", type=int, default=8102)
    parser.add_argument("--skip-rest", action="store_true")
    parser.add_argument("--skip-cli", action="store_true")
    parser.add_argument("--rest-only", action="store_true")
    parser.add_argument(
        "--draw-steps", type=int, default=2_000, help="steps of the random and captured rows"
    )
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="estimate-bench-"))
    results = []
    try:
        if not args.rest_only:
            results += in_process(args.steps)
            results += seeded_draws(args.draw_steps)
        if not args.skip_cli and not args.rest_only:
            results += cli(scratch, args.cli_steps)
        if not args.skip_rest:
            results += rest(scratch, args.port)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    print("| scenario | steps/s | p50 ms (REST) |")
    print("| --- | --- | --- |")
    for r in results:
        print(f"| {r['name']} | {r['steps_per_s']:,.0f} | {r.get('p50_ms', '')} |")
    print()
    for r in results:
        print(json.dumps(r))


if __name__ == "__main__":
    main()
