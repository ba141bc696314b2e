"""Issue 13 (R44, R45): RemoteTables.estimate and estimate_batch against a live registry give
the typed results ComponentTables gives in process on the shipped H200 bundles, bit for bit
(JSON carries floats exactly), refusals included; a cached bundle answers in process."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from moetables import ComponentTables, load_cluster
from moetables.client import RemoteTables
from moetables.errors import CoverageError, QueryError
from registry.bundles.services import publish_bundle
from tests.moetables.test_captured_estimate import qwen_like_profile

ROOT = Path(__file__).resolve().parents[2]
H200 = ROOT / "bundles/H200/Qwen/Qwen3-30B-A3B-Instruct-2507/bf16"
LIVE = ROOT / "bundles/H200-vllm-live/Qwen/Qwen3-30B-A3B-Instruct-2507/bf16"
CLUSTER = ROOT / "clusters/h200x2-nvlink.yaml"
SELECT: dict[str, Any] = {
    "hardware": "H200",
    "model": "Qwen/Qwen3-30B-A3B-Instruct-2507",
    "variant": "bf16",
    "backend": "vllm-modular",
}
OPENED: list[RemoteTables] = []


@pytest.fixture
def remote(live_server: Any) -> Iterator[RemoteTables]:
    publish_bundle(H200)
    tables = RemoteTables(live_server.url, **SELECT)
    OPENED.append(tables)
    yield tables
    for opened in OPENED:
        opened.close()
    OPENED.clear()


@pytest.fixture(scope="module")
def local() -> ComponentTables:
    return ComponentTables(H200)


def _steps(n: int, seed: int = 3) -> np.ndarray:
    rng = np.random.default_rng(seed)
    steps = rng.integers(1, 1800, size=(n, 2))
    steps[5] = [1, 100_000]  # outside measured support: a per-step refusal
    return steps


CASES: list[dict[str, Any]] = [
    {"policy": "balanced"},
    {"policy": "balanced", "cluster": "file"},
    {"policy": "round_robin", "cluster": "file"},
    {"policy": "random", "seed": 7, "cluster": "file"},
    {"policy": "random", "seed": 7, "first_step": 11},
    {"policy": "random", "seed": 3, "tile_cost_us": "table"},  # steps name their own blocks
    {"policy": "round_robin", "tile_cost_us": 1.5},
    {"policy": "custom", "active_curve": [[1, 8.0], [200_000, 128.0]], "load_shares": [0.3, 0.7]},
    {"policy": "balanced", "mode": "graph", "capture_sizes": [1, 2, 4, 8, 16, 512]},
    {"policy": "captured", "profile": "inline", "layer": 3, "cluster": "file"},
    {"policy": "captured", "profile": "inline", "captured_expectation": True},
]


def _options(case: dict[str, Any]) -> dict[str, Any]:
    out = dict(case)
    if out.get("cluster") == "file":
        out["cluster"] = load_cluster(CLUSTER)
    if out.get("profile") == "inline":
        out["profile"] = qwen_like_profile()
    return out


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c.values()))[:40])
def test_it_estimates_a_batch_as_in_process(
    remote: RemoteTables, local: ComponentTables, case: dict[str, Any]
) -> None:
    """R44/R45: every array of every answered step, every refusal's code and message."""
    steps = _steps(40)
    options = _options(case)
    expected = local.estimate_batch(steps, tp=1, dp=2, **options)
    remote.estimate_steps = 16  # three requests (seeded ones too: each names its first step)
    got = remote.estimate_batch(steps, tp=1, dp=2, **options)
    assert got.code.tolist() == expected.code.tolist()
    assert (got.code != 0).any() and got.errors == expected.errors
    ok = expected.code == 0
    for name in ("compute_us", "wait_us", "transfer_us", "layer_us", "layer_compute_us"):
        a, b = getattr(expected, name), getattr(got, name)
        assert (a is None) == (b is None), name
        if a is not None:
            assert np.array_equal(a[ok], b[ok]), name
    for component, times in expected.components.items():
        assert np.array_equal(times[ok], got.components[component][ok]), component
    for field in ("local_rows", "tokens", "activated_experts", "local_assignments"):
        assert np.array_equal(
            getattr(expected.routing, field)[ok], getattr(got.routing, field)[ok]
        ), field
    assert got.as_dicts() == expected.as_dicts()
    counts = expected.routing.expert_counts
    if counts is not None:
        assert got.routing.expert_counts is not None
        assert np.array_equal(counts[ok], got.routing.expert_counts[ok])
        assert got.as_dicts(expert_counts=True) == expected.as_dicts(expert_counts=True)
    for i in np.flatnonzero(ok)[:5]:
        assert got.step(int(i)) == expected.step(int(i))
    with pytest.raises(CoverageError, match="rank"):
        got.step(5)


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c.values()))[:40])
def test_it_estimates_one_step_as_in_process(
    remote: RemoteTables, local: ComponentTables, case: dict[str, Any]
) -> None:
    options = _options(case)
    for tokens in ([5, 300], [1, 1], [2048, 17]):
        expected = local.estimate(tokens, tp=1, dp=2, **options)
        assert remote.estimate(tokens, tp=1, dp=2, **options) == expected
        assert remote.deployment(1, 2, 1).estimate(tokens, **options) == expected
    with pytest.raises(CoverageError) as refused:
        local.estimate([1, 100_000], tp=1, dp=2, **options)
    with pytest.raises(CoverageError) as remote_refused:
        remote.estimate([1, 100_000], tp=1, dp=2, **options)
    assert str(remote_refused.value) == str(refused.value)


def test_it_takes_a_histogram_and_a_shipped_cluster_by_name(
    remote: RemoteTables, local: ComponentTables, settings: Any
) -> None:
    settings.REGISTRY = {**settings.REGISTRY, "CLUSTER_DIR": str(ROOT / "clusters")}
    rng = np.random.default_rng(1)
    steps = rng.integers(1, 500, size=(6, 2))
    counts = [rng.multinomial(int(n.sum()) * 8, np.full(128, 1 / 128)) for n in steps]
    cluster = load_cluster(CLUSTER)
    expected = local.estimate_batch(
        steps, tp=1, dp=2, policy="histogram", expert_counts=counts, cluster=cluster
    )
    got = remote.estimate_batch(
        steps, tp=1, dp=2, policy="histogram", expert_counts=counts, cluster="h200x2-nvlink"
    )
    assert got.as_dicts(expert_counts=True) == expected.as_dicts(expert_counts=True)
    assert remote.estimate(
        steps[0], tp=1, dp=2, policy="histogram", expert_counts=counts[0], cluster=cluster
    ) == expected.step(0)


def test_it_sends_a_loaded_cluster_as_read(
    remote: RemoteTables, local: ComponentTables, tmp_path: Path
) -> None:
    """A cluster file with an unquoted date (YAML reads a date) travels inline all the same."""
    text = CLUSTER.read_text().replace("measured_at: '2026-11-30'", "measured_at: 2026-11-30")
    assert "measured_at: 2026-11-30" in text
    (tmp_path / "c.yaml").write_text(text)
    cluster = load_cluster(tmp_path / "c.yaml")
    expected = local.estimate([5, 300], tp=1, dp=2, cluster=cluster)
    assert remote.estimate([5, 300], tp=1, dp=2, cluster=cluster) == expected
    assert expected.layer_us is not None


def test_it_refuses_as_in_process_with_the_servers_message(
    remote: RemoteTables, local: ComponentTables
) -> None:
    """A malformed request is a QueryError, a deployment without tables a CoverageError."""
    for call in (
        {"policy": "nope"},
        {"policy": "histogram", "expert_counts": [1, 2, 3]},
        {"policy": "custom", "active_curve": [[10, 8.0], [20, 9.0]]},
    ):
        with pytest.raises(QueryError) as in_process:
            local.estimate([5, 300], tp=1, dp=2, **call)
        with pytest.raises(QueryError) as over_rest:
            remote.estimate([5, 300], tp=1, dp=2, **call)
        assert str(in_process.value) in str(over_rest.value)
    with pytest.raises(CoverageError):
        remote.estimate([5] * 8, tp=1, dp=8)
    with pytest.raises(TypeError, match="nonsense"):
        remote.estimate([5, 300], tp=1, dp=2, nonsense=1)


def test_it_answers_from_a_cached_bundle_offline(
    remote: RemoteTables, local: ComponentTables, tmp_path: Path
) -> None:
    cached = RemoteTables(remote.url, cache_dir=tmp_path, **SELECT)
    OPENED.append(cached)
    cluster = load_cluster(CLUSTER)
    expected = local.estimate([5, 300], tp=1, dp=2, cluster=cluster)
    assert cached.estimate([5, 300], tp=1, dp=2, cluster=cluster) == expected
    offline = RemoteTables(remote.url, cache_dir=tmp_path, offline=True, **SELECT)
    assert offline.estimate([5, 300], tp=1, dp=2, cluster=cluster) == expected
    batch = offline.estimate_batch(_steps(8), tp=1, dp=2, cluster=cluster)
    assert (
        batch.as_dicts() == local.estimate_batch(_steps(8), tp=1, dp=2, cluster=cluster).as_dicts()
    )
    with pytest.raises(QueryError, match="loaded Cluster"):
        offline.estimate([5, 300], tp=1, dp=2, cluster="h200x2-nvlink")


def test_it_estimates_with_a_published_profile_by_id(
    remote: RemoteTables, local: ComponentTables, tmp_path: Path
) -> None:
    """The captured policy with a profile the registry holds (its id), as with it inline."""
    import io

    from django.contrib.auth import get_user_model

    from moetables.profiles import read_profile, write_profile
    from registry.services.profiles import publish_profile

    data = write_profile(qwen_like_profile(), tmp_path / "q.routing.npz").read_bytes()
    upload = io.BytesIO(data)
    upload.name = "q.routing.npz"
    user = get_user_model().objects.create_user("simulator", password="x")
    record = publish_profile(upload, published_by=user).record
    profile = read_profile(data)
    for tokens in ([32, 32], [5, 300]):
        expected = local.estimate(tokens, tp=1, dp=2, policy="captured", profile=profile, layer=3)
        assert (
            remote.estimate(tokens, tp=1, dp=2, policy="captured", profile=record.pk, layer=3)
            == expected
        )
    with pytest.raises(QueryError, match=f"no published routing profile {record.pk + 99}"):
        remote.estimate([32, 32], tp=1, dp=2, policy="captured", profile=record.pk + 99)


def test_it_fetches_a_published_profile_for_a_cached_bundle(
    remote: RemoteTables, local: ComponentTables, tmp_path: Path
) -> None:
    """With ``cache_dir`` the estimate runs in process: a profile named by id is downloaded
    once, checked and kept beside the bundles; the answer is the inline profile's."""
    import io

    from django.contrib.auth import get_user_model

    from moetables.profiles import read_profile, write_profile
    from registry.services.profiles import publish_profile

    data = write_profile(qwen_like_profile(), tmp_path / "q.routing.npz").read_bytes()
    upload = io.BytesIO(data)
    upload.name = "q.routing.npz"
    user = get_user_model().objects.create_user("simulator", password="x")
    record = publish_profile(upload, published_by=user).record
    cache = tmp_path / "cache"
    cached = RemoteTables(remote.url, cache_dir=cache, **SELECT)
    OPENED.append(cached)
    profile = read_profile(data)
    for tokens in ([32, 32], [5, 300]):
        expected = local.estimate(tokens, tp=1, dp=2, policy="captured", profile=profile, layer=3)
        got = cached.estimate(tokens, tp=1, dp=2, policy="captured", profile=record.pk, layer=3)
        assert got == expected
    steps = _steps(6)
    assert (
        cached.estimate_batch(
            steps, tp=1, dp=2, policy="captured", profile=record.pk, seed=2
        ).as_dicts()
        == local.estimate_batch(
            steps, tp=1, dp=2, policy="captured", profile=profile, seed=2
        ).as_dicts()
    )
    kept = cache / "profiles" / f"{record.sha256}.routing.npz"
    assert kept.read_bytes() == data
    # A second client confirms its kept copy by ETag; a kept copy that drifted is replaced.
    again = RemoteTables(remote.url, cache_dir=cache, **SELECT)
    OPENED.append(again)
    assert again.profile(record.pk).steps == profile.steps
    kept.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    damaged = RemoteTables(remote.url, cache_dir=cache, **SELECT)
    OPENED.append(damaged)
    assert damaged.profile(record.pk).steps == profile.steps
    assert kept.read_bytes() == data
    with pytest.raises(QueryError, match="positive integer"):
        damaged.profile(0)
    with pytest.raises(QueryError, match=f"no published routing profile {record.pk + 99}"):
        cached.estimate([32, 32], tp=1, dp=2, policy="captured", profile=record.pk + 99)


def test_a_remote_rank_told_another_deployment_refuses_as_in_process(
    remote: RemoteTables, local: ComponentTables
) -> None:
    """A rank's tables estimate their own deployment, remote as in process (R43: a clear
    error naming the argument, not a TypeError about duplicate keywords)."""
    for tables in (local, remote):
        rank = tables.deployment(1, 2, 1)
        with pytest.raises(QueryError, match=r"rank 1 of TP1/DP2 .* got dp=4"):
            rank.estimate([5, 300], dp=4)
        with pytest.raises(QueryError, match=r"got tp=2"):
            rank.estimate_batch([[5, 300]], tp=2)
    same = remote.deployment(1, 2, 1).estimate([5, 300], tp=1, dp=2)
    assert same == local.deployment(1, 2, 1).estimate([5, 300])


def test_the_load_spread_charge_choices_answer_as_in_process(
    remote: RemoteTables, local: ComponentTables
) -> None:
    """Issue 18, session 11: the default ("auto"), None (sent as "none") and "table" over REST
    equal their in-process answers."""
    steps = _steps(8)
    for extra in ({}, {"tile_cost_us": None}, {"tile_cost_us": "table"}):
        kw = {"tp": 1, "dp": 2, "policy": "random", "seed": 2, **extra}
        got = remote.estimate_batch(steps, **kw)
        want = local.estimate_batch(steps, **kw)
        assert np.array_equal(got.compute_us, want.compute_us, equal_nan=True), extra
        assert got.notes == want.notes
