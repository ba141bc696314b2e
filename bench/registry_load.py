"""Load client of the registry benchmarks: raw HTTP/1.1 over asyncio, in its own process.

    python bench/registry_load.py --url http://127.0.0.1:8000/api/v1/lookup \\
        --body-file queries.json --requests 2000 --concurrency 2

Prints one JSON object: requests, errors, latency percentiles (ms) and requests per second.
Latency is from the first byte sent to the last byte received. Only loopback addresses are
accepted: this is a local benchmark, never a load test of another machine.
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import json
import statistics
import time
from pathlib import Path
from urllib.parse import urlsplit


async def _read_response(reader: asyncio.StreamReader) -> tuple[int, bool, int]:
    status_line = await reader.readline()
    if not status_line:
        raise ConnectionError("server closed the connection")
    status = int(status_line.split()[1])
    length = None
    chunked = False
    close = False
    while True:
        line = await reader.readline()
        if line in (b"\r\n", b"\n", b""):
            break
        name, _, value = line.decode("latin-1").partition(":")
        name = name.strip().lower()
        value = value.strip().lower()
        if name == "content-length":
            length = int(value)
        elif name == "transfer-encoding" and "chunked" in value:
            chunked = True
        elif name == "connection" and value == "close":
            close = True
    size = 0
    if chunked:
        while True:
            chunk = int((await reader.readline()).split(b";")[0], 16)
            if chunk == 0:
                await reader.readline()
                break
            size += len(await reader.readexactly(chunk))
            await reader.readline()
    elif length is not None:
        size = len(await reader.readexactly(length))
    else:
        size = len(await reader.read())
        close = True
    return status, close, size


async def _client(
    host: str, port: int, request: bytes, count: int, latencies: list[float], errors: list[str]
) -> None:
    reader = writer = None
    for _ in range(count):
        if writer is None:
            reader, writer = await asyncio.open_connection(host, port)
        assert reader is not None
        start = time.perf_counter()
        writer.write(request)
        try:
            status, close, _ = await _read_response(reader)
        except (ConnectionError, asyncio.IncompleteReadError) as exc:
            errors.append(str(exc))
            writer.close()
            reader = writer = None
            continue
        latencies.append(time.perf_counter() - start)
        if status >= 400:
            errors.append(f"HTTP {status}")
        if close:
            writer.close()
            reader = writer = None
    if writer is not None:
        writer.close()


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[index]


async def run(
    url: str, body: bytes | None, requests: int, concurrency: int, warmup: int
) -> dict[str, object]:
    parts = urlsplit(url)
    host = parts.hostname or "127.0.0.1"
    if not ipaddress.ip_address(host if host != "localhost" else "127.0.0.1").is_loopback:
        raise SystemExit(f"{host} is not a loopback address")
    port = parts.port or 80
    path = parts.path + (f"?{parts.query}" if parts.query else "")
    method = "POST" if body is not None else "GET"
    head = [f"{method} {path} HTTP/1.1", f"Host: {host}:{port}", "Accept: application/json"]
    if body is not None:
        head += ["Content-Type: application/json", f"Content-Length: {len(body)}"]
    request = ("\r\n".join(head) + "\r\n\r\n").encode() + (body or b"")
    scratch: list[float] = []
    await _client(host, port, request, warmup, scratch, [])
    latencies: list[float] = []
    errors: list[str] = []
    share = [
        requests // concurrency + (1 if i < requests % concurrency else 0)
        for i in range(concurrency)
    ]
    start = time.perf_counter()
    await asyncio.gather(*(_client(host, port, request, n, latencies, errors) for n in share))
    elapsed = time.perf_counter() - start
    ms = [v * 1000 for v in latencies]
    return {
        "url": url,
        "method": method,
        "request_bytes": len(request),
        "requests": len(latencies),
        "concurrency": concurrency,
        "errors": len(errors),
        "first_error": errors[0] if errors else None,
        "p50_ms": round(_percentile(ms, 0.50), 3),
        "p90_ms": round(_percentile(ms, 0.90), 3),
        "p99_ms": round(_percentile(ms, 0.99), 3),
        "mean_ms": round(statistics.fmean(ms), 3),
        "requests_per_s": round(len(latencies) / elapsed, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--body-file", type=Path, help="POST this JSON file (else GET)")
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--warmup", type=int, default=20)
    args = parser.parse_args()
    body = args.body_file.read_bytes() if args.body_file else None
    result = asyncio.run(run(args.url, body, args.requests, args.concurrency, args.warmup))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
