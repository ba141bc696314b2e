"""Issue 6, item 5: drive one acquisition job through the registry's HTTP API and record it.

Run by ``scripts/h200_jobs_e2e.sh`` on the GPU machine once the registry server and a GPU worker
are up: queues a job with ``POST /api/v1/jobs/`` (token), follows ``GET /api/v1/jobs/{id}/``
until it ends, then reads the published bundle and answers one lookup from it, exactly as a
simulator would. Everything it sees is appended to ``OUT/e2e.log`` and the final JSON
documents are written beside it (``job.json``, ``bundle.json``, ``lookup.json``).

    python3 scripts/h200_jobs_e2e.py BASE_URL TOKEN OUT_DIR [--limit-s 420]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

JOB = {
    "command": "slice",
    "model": "Qwen/Qwen3-30B-A3B-Instruct-2507",
    "hardware": "H200",
    "tp": [1],
    "tp_refresh": [1],
    "dp": [1],
    "max_num_batched_tokens": 2048,
    "max_num_seqs": 128,
    "rounds": 3,
    "iterations": 3,
    "grid_factor": 8,
    "backend": "vllm-modular",
    "device": "cuda",
}


def call(
    base: str, method: str, path: str, body: Any = None, token: str | None = None
) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(base + path, data=data, method=method)
    request.add_header("Accept", "application/json")
    if data is not None:
        request.add_header("Content-Type", "application/json")
    if token:
        request.add_header("Authorization", f"Token {token}")
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read() or b"null")
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("base")
    parser.add_argument("token")
    parser.add_argument("out", type=Path)
    parser.add_argument("--limit-s", type=float, default=420.0)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    log_file = (args.out / "e2e.log").open("a")

    def log(message: str) -> None:
        line = f"{time.strftime('%H:%M:%S', time.gmtime())} {message}"
        print(line, flush=True)
        log_file.write(line + "\n")
        log_file.flush()

    log(f"POST {args.base}/api/v1/jobs/ {json.dumps(JOB)}")
    status, job = call(args.base, "POST", "/api/v1/jobs/", JOB, args.token)
    log(f"-> {status} {json.dumps(job)[:400]}")
    if status != 201:
        return 1
    job_id = job["id"]
    started = time.monotonic()
    seen = None
    while True:
        status, job = call(args.base, "GET", f"/api/v1/jobs/{job_id}/")
        view = (
            job["state"],
            job["phase"],
            job["points_done"],
            job["points_total"],
            job["eta_seconds"],
        )
        if view != seen:
            log(
                f"GET /api/v1/jobs/{job_id}/ -> {status} state={view[0]} phase={view[1]} "
                f"points={view[2]}/{view[3]} eta_s={view[4]}"
            )
            seen = view
        if job["state"] in ("succeeded", "failed", "cancelled"):
            break
        if time.monotonic() - started > args.limit_s:
            log("time limit reached: cancelling")
            call(args.base, "POST", f"/api/v1/jobs/{job_id}/cancel", {}, args.token)
            break
        time.sleep(2)
    (args.out / "job.json").write_text(json.dumps(job, indent=2) + "\n")
    log(
        f"job {job_id} ended: state={job['state']} error={job.get('error')!r} "
        f"after {time.monotonic() - started:.1f}s"
    )
    if job["state"] != "succeeded":
        log("log tail:\n" + (job.get("log_tail") or ""))
        return 1
    bundle_ref = job["result_bundle"]
    bundle_id = bundle_ref["id"] if isinstance(bundle_ref, dict) else bundle_ref
    status, bundle = call(args.base, "GET", f"/api/v1/bundles/{bundle_id}/")
    (args.out / "bundle.json").write_text(json.dumps(bundle, indent=2) + "\n")
    log(
        f"GET /api/v1/bundles/{bundle_id}/ -> {status} sha256={bundle.get('sha256')} "
        f"tables={len(bundle.get('tables', []))}"
    )
    download = urllib.request.urlopen(
        f"{args.base}/api/v1/bundles/{bundle_id}/download", timeout=60
    )
    archive = args.out / "published_bundle.tar.gz"
    archive.write_bytes(download.read())
    log(
        f"GET /api/v1/bundles/{bundle_id}/download -> {download.status} "
        f"{archive.stat().st_size} bytes, ETag {download.headers.get('ETag')}"
    )
    target = bundle["tables"][0]["target"]
    queries = [
        {"component": "gate_routing", "tokens": 64},
        {"component": "experts", "tokens": 64, "activated_experts": 64, "local_assignments": 512},
        {"component": "experts", "tokens": 1, "activated_experts": 8, "local_assignments": 8},
    ]
    body = {
        "bundle": bundle_id,
        "target": {key: target[key] for key in ("tp", "dp", "rank")},
        "queries": queries,
    }
    status, answer = call(args.base, "POST", "/api/v1/lookup", body)
    (args.out / "lookup.json").write_text(
        json.dumps({"request": body, "answer": answer}, indent=2) + "\n"
    )
    log(f"POST /api/v1/lookup -> {status} {json.dumps(answer)[:400]}")
    return 0 if status == 200 else 1


if __name__ == "__main__":
    sys.exit(main())
