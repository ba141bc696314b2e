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


@pytest.fixture(autouse=True)
def _fresh_cache() -> Iterator[None]:
    """Throttle and sign-in counters live in the cache: each test starts with none."""
    from django.core.cache import cache

    cache.clear()
    yield
