"""Fixtures of the registry tests: private storage per test, bundles to publish, clients."""

from __future__ import annotations

import io
import os
import tarfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from config.celery import app
from moetables import MoeTarget, write_bundle
from moetables.bundle import TableSpec
from registry.lookup.services import clear_lookup_cache

REPO = Path(__file__).resolve().parents[2]
SHIPPED = REPO / "bundles/llmservingsim-rtxpro6000/Qwen/Qwen3-30B-A3B-Instruct-2507/bf16"


@pytest.fixture(autouse=True)
def registry_dirs(settings: Any, tmp_path: Path) -> Iterator[Path]:
    """Every test gets its own blob store, checkouts and staging folder."""
    var = tmp_path / "var"
    settings.STORAGES = {
        **settings.STORAGES,
        "bundles": {
            "BACKEND": "registry.storage.ContentAddressedStorage",
            "OPTIONS": {"location": var / "blobs"},
        },
    }
    settings.REGISTRY = {
        **settings.REGISTRY,
        "CHECKOUT_DIR": var / "checkouts",
        "STAGING_DIR": var / "staging",
    }
    clear_lookup_cache()
    yield var
    clear_lookup_cache()


def _stored_files(var: Path) -> list[Path]:
    """Every file the registry has written outside staging (blobs, checkouts)."""
    found = [p for p in var.rglob("*") if p.is_file()]
    return [p for p in found if "staging" not in p.relative_to(var).parts]


@pytest.fixture
def stored_files() -> Callable[[Path], list[Path]]:
    return _stored_files


@pytest.fixture
def shipped() -> Path:
    return SHIPPED


def _contract(
    target: MoeTarget,
    *,
    experts: int,
    top_k: int,
    backend: str,
    adapter: str = "vllm-modular",
    vllm_version: str = "0.26.0",
) -> dict[str, Any]:
    local = experts // target.ep
    components = ["gate_routing", "experts"] + (["finalize_copy"] if target.dp > 1 else [])
    return {
        "target": target.as_dict(),
        "global_experts": experts,
        "global_top_k": top_k,
        "local_experts": local,
        "placement": "linear",
        "components": components,
        "modes": ["eager"],
        # Shaped as the acquisition writes it (an adapter; a reference one runs no vLLM).
        "backend": {"name": adapter, "native": adapter.startswith("vllm-")}
        | (
            {"native_backend": backend, "vllm_version": vllm_version}
            if adapter.startswith("vllm-")
            else {}
        ),
        "expert_conditioning": {"quality_relative_tolerance": 0.03},
    }


def _rows(target: MoeTarget, *, experts: int, top_k: int, scale: float) -> list[Any]:
    """A small table on a geometric grid of feasible points (synthetic, for tests only)."""
    local = experts // target.ep
    rows: list[Any] = []
    tokens = [1, 2, 4, 8, 16, 32]
    for n in tokens:
        rows.append(("gate_routing", "eager", n, -1, -1, scale * (5.0 + 0.1 * n)))
        if target.dp > 1:
            rows.append(("finalize_copy", "eager", n, -1, -1, scale * (2.0 + 0.05 * n)))
    remote = experts - local
    for n in [t * target.dp for t in tokens]:
        for a in sorted({1, 2, local // 2, local}):
            low = max(a, n * max(0, top_k - remote))
            high = n * min(top_k, a)
            for m in sorted({low, high}):
                if 1 <= a <= local and low <= m <= high:
                    rows.append(("experts", "eager", n, a, m, scale * (10.0 + a + 0.01 * m)))
        if remote >= top_k:
            rows.append(("experts", "eager", n, 0, 0, scale * 3.0))
    return rows


MakeBundle = Callable[..., Path]


@pytest.fixture
def make_bundle(tmp_path: Path) -> MakeBundle:
    """Write a small current-layout bundle with moetables' own writer; returns its folder."""
    counter = iter(range(10_000))

    def make(
        *,
        hardware: str = "SYNTH-GPU",
        model: str = "synthetic/moe-8e",
        variant: str = "bf16",
        tp: int = 1,
        dp: int = 1,
        experts: int = 8,
        top_k: int = 2,
        backend: str = "TRITON",
        adapter: str = "vllm-modular",
        vllm_version: str = "0.26.0",
        scale: float = 1.0,
        measured_at: str = "2026-11-01T12:00:00+00:00",
        meta: dict[str, Any] | None = None,
        coverage: dict[str, Any] | None = None,
        rows: list[Any] | None = None,
    ) -> Path:
        dest = tmp_path / "made" / f"bundle{next(counter)}" / variant
        specs = []
        for rank in range(tp * dp):
            target = MoeTarget.for_rank(tp, dp, rank)
            made = _rows(target, experts=experts, top_k=top_k, scale=scale * (1 + rank / 10))
            specs.append(
                TableSpec(
                    target=target,
                    contract=_contract(
                        target,
                        experts=experts,
                        top_k=top_k,
                        backend=backend,
                        adapter=adapter,
                        vllm_version=vllm_version,
                    ),
                    coverage={
                        "complete": True,
                        "completed_rounds": 3,
                        "conditioning_summary": {
                            "checked_points": 4,
                            "failed_points": 0,
                            "max_relative_change": 0.01,
                        },
                        **(coverage or {}),
                    },
                    rows=made + (rows or []),
                )
            )
        header = {
            "hardware": hardware,
            "model": model,
            "variant": variant,
            "measured_at": measured_at,
            "synthetic": "generated by the registry tests; not a measurement",
            **(meta or {}),
        }
        return write_bundle(dest, header, specs)

    return make


def _tar_gz_of(folder: Path, prefix: str = "bundle") -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        tar.add(folder, arcname=prefix)
    return buffer.getvalue()


@pytest.fixture
def tar_gz_of() -> Callable[..., bytes]:
    """A .tar.gz of a folder, the way a person would pack a bundle."""
    return _tar_gz_of


@pytest.fixture
def api() -> APIClient:
    return APIClient()


@pytest.fixture
def uploader(db: None) -> APIClient:
    from django.contrib.auth import get_user_model

    user = get_user_model().objects.create_user("uploader", password="x")
    token = Token.objects.create(user=user)
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Token {token.key}")
    return api


@pytest.fixture
def published(db: None, shipped: Path) -> Any:
    from registry.bundles.services import publish_bundle

    return publish_bundle(shipped).bundle


# Redis database of the broker tests (emptied before and after each one).
REDIS_URL = os.environ.get("REGISTRY_TEST_REDIS_URL", "redis://127.0.0.1:6379/14")


@pytest.fixture
def redis_broker() -> Iterator[Any]:
    """Celery on a real, empty Redis (skipped where none answers); yields the Redis client."""
    redis = pytest.importorskip("redis")
    client = redis.Redis.from_url(REDIS_URL)
    try:
        client.ping()
    except redis.exceptions.ConnectionError:
        pytest.skip(f"no Redis at {REDIS_URL}")
    client.flushdb()
    saved = (app.conf.broker_url, app.conf.broker_transport_options)
    app.conf.broker_url = REDIS_URL
    app.conf.broker_transport_options = {"visibility_timeout": 3600}
    yield client
    app.conf.broker_url, app.conf.broker_transport_options = saved
    client.flushdb()
