"""Issue 17: a hypothesis fuzz over archive structure and bytes, bounded for CI. Each example
is a valid bundle with one hostile mutation (tests/registry/hostile.py); over all of them:
0 server errors, 0 accepted bad (every rule-breaking archive refused, every accepted one a
valid bundle as stored), 0 blobs or rows left behind by a refused upload. The recorded run of
10,000+ archives is bench/reliability.py (R44)."""

from __future__ import annotations

import os
import random
from typing import TYPE_CHECKING, Any

import pytest
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from tests.registry.hostile import FuzzReport, base_members, make_hostile, upload_and_check

if TYPE_CHECKING:
    from pathlib import Path

    from rest_framework.test import APIClient

pytestmark = pytest.mark.django_db

EXAMPLES = int(os.environ.get("HOSTILE_EXAMPLES", "60"))


@pytest.fixture
def members(tmp_path_factory: Any) -> Any:
    return base_members(tmp_path_factory.mktemp("hostile") / "bundle")


def test_it_survives_hostile_archives(
    uploader: APIClient,
    members: Any,
    registry_dirs: Path,
    settings: Any,
) -> None:
    """Issue 17: 0 server errors, 0 accepted bad, 0 left behind."""
    settings.REGISTRY = {**settings.REGISTRY, "UPLOAD_THROTTLE": None}
    report = FuzzReport()

    @given(rng=st.randoms(use_true_random=False))
    @hypothesis_settings(
        max_examples=EXAMPLES,
        deadline=None,
        database=None,
        derandomize=True,
        suppress_health_check=list(HealthCheck),
    )
    def one(rng: random.Random) -> None:
        upload_and_check(uploader, make_hostile(rng, members), registry_dirs, report)

    one()
    assert report.uploads >= EXAMPLES
    assert report.server_errors == [], report.server_errors[:5]
    assert report.accepted_bad == [], report.accepted_bad[:5]
    assert report.left_behind == [], report.left_behind[:5]
    assert report.refused > report.uploads // 3  # the mutations do reach the rules
