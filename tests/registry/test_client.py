"""Issue 13.2: moetables.client.RemoteTables against a live registry (pytest-django's live
server) answers bit for bit as in-process ComponentTables on the shipped bundles, refusals
included; it batches, retries, and downloads a bundle once into a cache it can answer from
offline."""

from __future__ import annotations

import http.server
import json
import math
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from moetables import ComponentTables
from moetables.client import RegistryError, RemoteTables, _Http
from moetables.errors import BundleError, CoverageError, QueryError
from registry.bundles.models import Bundle
from registry.bundles.services import publish_bundle

ROOT = Path(__file__).resolve().parents[2] / "bundles"
QWEN = "Qwen/Qwen3-30B-A3B-Instruct-2507/bf16"
FOLDERS = {
    "historical": ROOT / "llmservingsim-rtxpro6000" / QWEN,
    "modular": ROOT / "H200" / QWEN,
    "reference": ROOT / "H200-torch-reference" / QWEN,
    "live": ROOT / "H200-vllm-live" / QWEN,
}


def _queries(tables: Any) -> list[Any]:
    """Inside and outside support, infeasible and malformed, over the table's own range."""
    rng = np.random.default_rng(5)
    geometry = tables.entry.geometry
    local, k = geometry.local_experts, geometry.top_k
    out: list[Any] = []
    for component in tables.components:
        for mode in tables.modes:
            for _ in range(12):
                n = int(rng.integers(1, 5000))
                if component == "experts":
                    a = int(rng.integers(0, local + 2))
                    m = int(rng.integers(a, max(a, 1) * k + 2)) if a else 0
                    out.append(
                        {
                            "component": component,
                            "mode": mode,
                            "tokens": n,
                            "activated_experts": a,
                            "local_assignments": m,
                        }
                    )
                else:
                    out.append({"component": component, "mode": mode, "tokens": n})
    out += [
        {"component": "nope", "tokens": 1},
        {"component": "experts", "tokens": 3},
        7,
        {"component": "gate_routing", "tokens": 0},
        {"component": "gate_routing", "tokens": 4, "activated_experts": 2},
    ]
    return out


@pytest.fixture
def registry(live_server: Any) -> Iterator[dict[str, Bundle]]:
    yield {name: publish_bundle(path).bundle for name, path in FOLDERS.items()}
    # Keep-alive connections hold a live-server thread (and its database session) open.
    for tables in OPENED:
        tables.close()
    OPENED.clear()


OPENED: list[RemoteTables] = []


def remote_tables(url: str, **kwargs: Any) -> RemoteTables:
    tables = RemoteTables(url, **kwargs)
    OPENED.append(tables)
    return tables


def _same_outcome(local: Any, remote: Any, *args: Any, **kwargs: Any) -> None:
    try:
        expected: Any = local(*args, **kwargs)
    except (QueryError, CoverageError) as exc:
        expected = (type(exc), str(exc))
    try:
        got: Any = remote(*args, **kwargs)
    except (QueryError, CoverageError) as exc:
        got = (type(exc), str(exc))
    assert got == expected, (args, kwargs)


@pytest.mark.django_db(transaction=True)
def test_it_answers_as_component_tables_bit_for_bit(
    live_server: Any, registry: dict[str, Bundle]
) -> None:
    for name, bundle in registry.items():
        local = ComponentTables(FOLDERS[name])
        remote = remote_tables(live_server.url, bundle=bundle.pk)
        for entry in local.bundle.entries:
            t = entry.target
            here = local.deployment(t.tp, t.dp, t.rank, t.sequence_parallel)
            there = remote.deployment(t.tp, t.dp, t.rank, t.sequence_parallel)
            assert there.answerer["sha256"] == bundle.sha256  # type: ignore[union-attr]
            queries = _queries(here)
            assert there.answer(queries) == here.answer(queries)
            for q in queries[:40]:
                if isinstance(q, dict) and q.get("component") in here.components:
                    args = {k: v for k, v in q.items() if k != "component"}
                    _same_outcome(here.time_us, there.time_us, q["component"], **args)
            for component in here.components:
                rows = [
                    q
                    for q in queries
                    if isinstance(q, dict)
                    and q.get("component") == component
                    and q.get("mode") == "eager"
                ]
                n = [q["tokens"] for q in rows]
                if component == "experts":
                    a = [q["activated_experts"] for q in rows]
                    m = [q["local_assignments"] for q in rows]
                    mine, theirs = here.batch(component, n, a, m), there.batch(component, n, a, m)
                else:
                    mine, theirs = here.batch(component, n), there.batch(component, n)
                assert np.array_equal(mine.time_us, theirs.time_us, equal_nan=True)
                assert np.array_equal(mine.code, theirs.code)
            _same_outcome(here.batch, there.batch, "no_such_component", [1])
            _same_outcome(here.batch, there.batch, "experts", [1, 2], [1])


@pytest.mark.django_db(transaction=True)
def test_refusals_are_the_same_errors_with_the_same_messages(
    live_server: Any, registry: dict[str, Bundle]
) -> None:
    local = ComponentTables(FOLDERS["live"])
    remote = remote_tables(live_server.url, bundle=registry["live"].sha256)
    _same_outcome(local.deployment, remote.deployment, 1, 2, 0)  # no DP2 table
    _same_outcome(local.deployment, remote.deployment, 1, 2, 0)  # absent, kept
    _same_outcome(local.deployment, remote.deployment, 1, 2, 5)  # rank beyond EP
    with pytest.raises(BundleError, match="no published bundle matches"):
        remote_tables(live_server.url, bundle="0" * 64).deployment(1, 1, 0)
    with pytest.raises(QueryError, match="hardware, model and variant go together"):
        remote_tables(live_server.url, hardware="H200")
    with pytest.raises(RegistryError):
        RemoteTables("http://127.0.0.1:9", bundle=1, retries=1, backoff_s=0.01).deployment(1, 1, 0)


@pytest.mark.django_db(transaction=True)
def test_a_name_resolves_to_the_best_bundle_for_each_target(
    live_server: Any, registry: dict[str, Bundle]
) -> None:
    remote = remote_tables(
        live_server.url, hardware="H200", model=QWEN.rsplit("/", 1)[0], variant="bf16"
    )
    assert remote.deployment(1, 2, 0).answerer["backend"] == "vllm-modular"  # type: ignore[union-attr]
    pinned = remote_tables(
        live_server.url,
        hardware="H200",
        model=QWEN.rsplit("/", 1)[0],
        variant="bf16",
        backend="torch-reference",
    )
    assert pinned.deployment(1, 1, 0).answerer["id"] == registry["reference"].pk  # type: ignore[union-attr]


@pytest.mark.django_db(transaction=True)
def test_it_downloads_once_and_answers_offline(
    live_server: Any,
    registry: dict[str, Bundle],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    statuses: list[tuple[str, int]] = []
    original = _Http.request

    def spy(self: _Http, method: str, path: str, *args: Any, **kwargs: Any) -> Any:
        result = original(self, method, path, *args, **kwargs)
        statuses.append((path.rsplit("/", 1)[-1], result[0]))
        return result

    monkeypatch.setattr(_Http, "request", spy)
    name = {"hardware": "H200", "model": QWEN.rsplit("/", 1)[0], "variant": "bf16"}
    cache = tmp_path / "cache"
    first = remote_tables(live_server.url, **name, cache_dir=cache).deployment(1, 2, 1)
    assert (cache / registry["modular"].sha256 / "meta.yaml").is_file()
    assert ("download", 200) in statuses
    statuses.clear()
    again = remote_tables(live_server.url, **name, cache_dir=cache).deployment(1, 2, 1)
    assert ("download", 304) in statuses  # confirmed by ETag, not downloaded again
    statuses.clear()
    offline = remote_tables(live_server.url, **name, cache_dir=cache, offline=True)
    here = ComponentTables(FOLDERS["modular"]).deployment(1, 2, 1)
    queries = _queries(here)
    assert offline.deployment(1, 2, 1).answer(queries) == here.answer(queries)
    assert first.answer(queries) == again.answer(queries) == here.answer(queries)
    assert statuses == []  # offline never touched the network
    with pytest.raises(BundleError, match="offline"):
        offline.deployment(1, 1, 0)


class _Flaky(http.server.BaseHTTPRequestHandler):
    """503 (Retry-After: 0) on the first request, then the answer."""

    calls = 0

    def do_POST(self) -> None:
        type(self).calls += 1
        self.rfile.read(int(self.headers["Content-Length"]))
        if type(self).calls == 1:
            self.send_response(503)
            self.send_header("Retry-After", "0")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        body = json.dumps({"answers": [{"time_us": 1.5}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def flaky() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Flaky)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_it_retries_an_unavailable_registry_with_backoff(flaky: str) -> None:
    http_ = _Http(flaky, None, timeout=5, retries=2, backoff_s=0.001)
    status, _, data = http_.request("POST", "/api/v1/lookup", b"{}")
    assert (status, json.loads(data)["answers"][0]["time_us"]) == (200, 1.5)
    assert _Flaky.calls == 2
    assert not math.isnan(1.5)


@pytest.mark.django_db(transaction=True)
def test_a_kernel_step_bundle_answers_as_component_tables_bit_for_bit(live_server: Any) -> None:
    """A kernel-step table (answered per kernel segment in N, R40) through RemoteTables: the
    same answers, batches and refusals as in process, next to every switch too."""
    path = ROOT / "H200-vllm-modular-f2k" / QWEN
    bundle = publish_bundle(path).bundle
    local = ComponentTables(path)
    remote = remote_tables(live_server.url, bundle=bundle.pk)
    try:
        for entry in local.bundle.entries:
            t = entry.target
            here = local.deployment(t.tp, t.dp, t.rank, t.sequence_parallel)
            there = remote.deployment(t.tp, t.dp, t.rank, t.sequence_parallel)
            switches = here.kernel_switches
            assert switches is not None
            g = here.entry.geometry
            near = [
                {
                    "component": "experts",
                    "tokens": n,
                    "activated_experts": a,
                    "local_assignments": g.balanced_total(n) if g.remote_experts else 8 * n,
                }
                for s in switches.switches(4096)
                for n in (s, s + 1)
                for a in (8, 40)
            ]
            queries = _queries(here) + near
            assert there.answer(queries) == here.answer(queries)
            n = [q["tokens"] for q in near]
            a = [q["activated_experts"] for q in near]
            m = [q["local_assignments"] for q in near]
            mine, theirs = here.batch("experts", n, a, m), there.batch("experts", n, a, m)
            assert np.array_equal(mine.time_us, theirs.time_us, equal_nan=True)
            assert np.array_equal(mine.code, theirs.code)
            for q in near[:12]:
                args = {k: v for k, v in q.items() if k != "component"}
                _same_outcome(here.time_us, there.time_us, "experts", **args)
    finally:
        for tables in OPENED:
            tables.close()
        OPENED.clear()
