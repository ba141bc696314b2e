"""Query-count baselines (as netbox keeps them): the busiest reads stay O(1) in the number of
rows they show, so an N+1 added by a serializer or a template fails here (R31: the registry's
reads stay fast as it grows)."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

import pytest
from django.test import Client

from registry.bundles.services import publish_bundle
from registry.models import AcquisitionJob, Bundle

if TYPE_CHECKING:
    from rest_framework.test import APIClient

pytestmark = pytest.mark.django_db

MaxQueries = Callable[[int], AbstractContextManager[Any]]


def _bundles(published: Bundle, make_bundle: Any, count: int) -> list[Bundle]:
    made = [
        make_bundle(hardware=f"H{100 + i}", model=f"synthetic/m{i}", dp=1 + i % 2)
        for i in range(count)
    ]
    return [published, *(publish_bundle(path).bundle for path in made)]


def _jobs(count: int, bundle: Bundle) -> None:
    for i in range(count):
        AcquisitionJob.objects.create(
            parameters={
                "command": "slice",
                "model": "synthetic/m",
                "hardware": "H200",
                "tp": [1],
                "tp_refresh": [1],
                "dp": [1],
            },
            queue="gpu.H200",
            state="succeeded" if i % 2 else "running",
            result_bundle=bundle if i % 2 else None,
        )


@pytest.mark.parametrize("extra", [1, 4])
def test_it_lists_bundles_in_a_fixed_number_of_queries(
    api: APIClient,
    published: Bundle,
    make_bundle: Any,
    django_assert_max_num_queries: MaxQueries,
    extra: int,
) -> None:
    _bundles(published, make_bundle, extra)
    with django_assert_max_num_queries(BUNDLE_LIST):
        assert api.get("/api/v1/bundles/").status_code == 200


def test_it_shows_a_bundle_in_a_fixed_number_of_queries(
    api: APIClient,
    client: Client,
    published: Bundle,
    django_assert_max_num_queries: MaxQueries,
) -> None:
    with django_assert_max_num_queries(BUNDLE_DETAIL):
        assert api.get(f"/api/v1/bundles/{published.pk}/").status_code == 200
    client.get(f"/bundles/{published.pk}/")  # the first view checks the bundle out
    with django_assert_max_num_queries(BUNDLE_PAGE):
        assert client.get(f"/bundles/{published.pk}/").status_code == 200


@pytest.mark.parametrize("extra", [1, 4])
def test_it_renders_the_home_page_in_a_fixed_number_of_queries(
    client: Client,
    published: Bundle,
    make_bundle: Any,
    django_assert_max_num_queries: MaxQueries,
    extra: int,
) -> None:
    _bundles(published, make_bundle, extra)
    with django_assert_max_num_queries(HOME):
        assert client.get("/").status_code == 200


@pytest.mark.parametrize("count", [2, 8])
def test_it_lists_jobs_in_a_fixed_number_of_queries(
    api: APIClient,
    client: Client,
    published: Bundle,
    django_assert_max_num_queries: MaxQueries,
    count: int,
) -> None:
    _jobs(count, published)
    with django_assert_max_num_queries(JOB_LIST_PAGE):
        assert client.get("/jobs/").status_code == 200
    with django_assert_max_num_queries(JOB_LIST_API):
        assert api.get("/api/v1/jobs/").status_code == 200


# Measured on this commit (the same on SQLite and PostgreSQL); raise one only with a reason.
BUNDLE_LIST = 2
BUNDLE_DETAIL = 2
BUNDLE_PAGE = 2
HOME = 12  # 12 since the filters offer the tables' backends and vLLM versions (issue 13)
JOB_LIST_PAGE = 1
JOB_LIST_API = 2
