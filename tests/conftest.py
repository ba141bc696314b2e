"""Shared pytest setup: Django settings come from pyproject (config.settings), and the
database from DATABASE_URL (scripts/test.sh points it at PostgreSQL when one answers)."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, settings

# CI machines are small and shared: no per-example deadline, same example budget everywhere.
settings.register_profile(
    "ci",
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def pytest_configure(config: object) -> None:
    # WhiteNoise warns that var/static is absent until collectstatic ran; tests serve from apps.
    config.addinivalue_line(  # type: ignore[attr-defined]
        "filterwarnings", "ignore:No directory at:UserWarning"
    )


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # A test that takes the real Redis broker is marked `redis` by its fixture, so
    # ``-m "not redis"`` leaves out exactly those (they skip themselves where none answers).
    for item in items:
        if "redis_broker" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.redis)


@pytest.fixture(autouse=True)
def _fresh_cache() -> Iterator[None]:
    """Throttle and sign-in counters live in the cache: each test starts with none."""
    from django.core.cache import cache

    cache.clear()
    yield
