"""A list endpoint's filter value it cannot read is a 400 naming the field, never a filter
silently dropped (which answered the unfiltered list): django-filter's own validation."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from rest_framework.test import APIClient

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize(
    ("path", "field"),
    [
        ("/api/v1/bundles/?tp=two", "tp"),
        ("/api/v1/bundles/?dp=1.5", "dp"),
        ("/api/v1/bundles/?ep=0", "ep"),
        ("/api/v1/bundles/?rank=-1", "rank"),
        ("/api/v1/bundles/?layout=sideways", "layout"),
        ("/api/v1/bundles/?source=elsewhere", "source"),
        ("/api/v1/bundles/?native=maybe", "native"),
        ("/api/v1/bundles/?sequence_parallel=yes", "sequence_parallel"),
        ("/api/v1/jobs/?state=sideways", "state"),
    ],
)
def test_a_filter_value_it_cannot_read_is_a_400_naming_the_field(
    api: APIClient, path: str, field: str
) -> None:
    response = api.get(path)
    assert response.status_code == 400, response.content
    assert field in response.json()


def test_a_well_formed_value_no_bundle_has_is_an_empty_list(api: APIClient) -> None:
    """Not an error: a client asking for H100 bundles before any are published gets none."""
    response = api.get("/api/v1/bundles/?hardware=H100&tp=7")
    assert response.status_code == 200 and response.json()["count"] == 0
