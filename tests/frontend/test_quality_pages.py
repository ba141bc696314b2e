"""Pages of issue 14 without a browser: the compare page's rules, graph mode on an eager-only
table, the coverage page, the jobs list and a job's Retry and waiting notice."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from moetables import MoeTarget, write_bundle
from tests.frontend.test_pages import _figures
from tests.moetables.conftest import make_spec

pytestmark = [pytest.mark.django_db]


def _params() -> dict[str, Any]:
    from registry.jobs.parameters import validate_parameters

    return validate_parameters({"model": "Qwen/Qwen3-30B-A3B-Instruct-2507", "hardware": "H200"})


@pytest.fixture
def far_bundle(tmp_path: Path) -> Any:
    """Synthetic, tests only: measured only at 5,000 and 10,000 rows, far beyond the others."""
    from registry.bundles.services import publish_bundle

    spec = make_spec(MoeTarget.for_rank(1, 2, 0), tokens=[5000, 10000])
    header = {"hardware": "FAR-GPU", "model": "synthetic/far", "variant": "bf16"}
    return publish_bundle(write_bundle(tmp_path / "far" / "bf16", header, [spec])).bundle


def test_compare_says_when_two_tables_share_no_support(
    client: Client, current_bundle: Any, far_bundle: Any
) -> None:
    near, far = current_bundle.tables.first(), far_bundle.tables.first()
    html = client.get(f"/compare/?a={far.pk}&b={near.pk}").content.decode()
    assert "shares no measured support" in html
    html = client.get(f"/compare/?a={current_bundle.tables.last().pk}&b={near.pk}").content.decode()
    assert "shares no measured support" not in html


def test_compare_answers_404_for_a_missing_table(client: Client, current_bundle: Any) -> None:
    table = current_bundle.tables.first()
    assert client.get(f"/compare/?a={table.pk}&b=999999").status_code == 404
    assert client.get(f"/compare/?a=oops&b={table.pk}").status_code == 404
    assert client.get(f"/compare/?a={table.pk}&b={table.pk}&also=999999").status_code == 404


def test_compare_overlays_more_than_two_tables(
    client: Client, current_bundle: Any, shipped_bundle: Any
) -> None:
    a, b = current_bundle.tables.all()[:2]
    c = shipped_bundle.tables.first()
    html = client.get(f"/compare/?a={a.pk}&b={b.pk}&also={c.pk}").content.decode()
    figures = _figures(html)
    overlay = figures["compare2"]["data"]  # expert rows of every table
    assert len(overlay) == 3
    assert len(figures["compare3"]["data"]) == 2  # a ratio for each table after the first
    assert " tp1 tp1" not in html


def test_graph_mode_on_an_eager_only_table_says_so(client: Client, current_bundle: Any) -> None:
    table = current_bundle.tables.first()
    html = client.get(f"/tables/{table.pk}/?mode=graph").content.decode()
    assert "has no graph-mode rows" in html
    assert "has no graph-mode rows" not in client.get(f"/tables/{table.pk}/").content.decode()


def test_the_jobs_list_shows_who_queued_what_and_when(client: Client) -> None:
    from registry.models import AcquisitionJob

    user = get_user_model().objects.create_user("ann", password="x")
    AcquisitionJob.objects.create(
        created_by=user, parameters=_params(), queue="gpu.H200", state="failed"
    )
    html = client.get("/jobs/").content.decode()
    assert "Queued by" in html and ">ann<" in html and "UTC" in html


def test_a_job_page_offers_retry_and_says_when_no_worker_exists(client: Client) -> None:
    from registry.models import AcquisitionJob

    owner = get_user_model().objects.create_user("ann", password="x")
    get_user_model().objects.create_user("bob", password="x")
    job = AcquisitionJob.objects.create(
        created_by=owner, queue="gpu.H200", state="failed", parameters=_params()
    )
    assert 'id="job-retry"' not in client.get(f"/jobs/{job.pk}/").content.decode()
    client.login(username="bob", password="x")
    assert 'id="job-retry"' not in client.get(f"/jobs/{job.pk}/").content.decode()
    response = client.post(f"/jobs/{job.pk}/retry")
    job.refresh_from_db()
    assert (
        response.status_code == 403 and job.state == "failed"
    )  # not bob's to retry (registry.permissions)
    client.login(username="ann", password="x")
    assert 'id="job-retry"' in client.get(f"/jobs/{job.pk}/").content.decode()
    queued = AcquisitionJob.objects.create(queue="gpu.H200", parameters=_params())
    html = client.get(f"/jobs/{queued.pk}/").content.decode()
    assert "no worker of queue gpu.H200 has been seen" in html


def test_the_coverage_page_lists_tables_and_gaps(
    client: Client, current_bundle: Any, far_bundle: Any
) -> None:
    html = client.get("/coverage/").content.decode()
    assert 'id="coverage-matrix"' in html and "gap" in html
    assert f'href="/tables/{current_bundle.tables.first().pk}/"' in html
    assert "Request this" not in html  # signed out


def test_the_web_form_refuses_a_cell_its_backend_cannot_measure(
    client: Client, h200_bundle: Any
) -> None:
    """A forged form for a live DP2 cell (the page shows no button there, R25) records nothing
    and says why."""
    from django.contrib.auth import get_user_model

    from registry.models import CoverageRequest

    get_user_model().objects.create_user("ann", password="x")
    client.login(username="ann", password="x")
    cell = {
        "hardware": "H200",
        "model": "Qwen/Qwen3-30B-A3B-Instruct-2507",
        "variant": "bf16",
        "backend": "vllm-live",
        "tp": "1",
        "dp": "2",
        "rank": "0",
        "sequence_parallel": "0",
    }
    html = client.post("/coverage/request", cell, follow=True).content.decode()
    assert "cannot request this cell: not measurable by vllm-live" in html
    assert "TP1/DP1/EP1 only (R25)" in html
    assert not CoverageRequest.objects.exists()


def test_an_exploratory_bundle_is_labelled(client: Client, current_bundle: Any) -> None:
    type(current_bundle).objects.filter(pk=current_bundle.pk).update(exploratory=True)
    html = client.get(f"/bundles/{current_bundle.pk}/").content.decode()
    assert 'id="bundle-exploratory"' in html and "above the method's 3 %" in html


def test_the_stability_sentence_and_the_coverage_card_agree(
    client: Client, h200_bundle: Any
) -> None:
    """Issue 14: one number, rounded once ("2.38%" in both places, not "2 %" beside it)."""
    table = h200_bundle.tables.get(dp=2, rank=1)
    html = client.get(f"/tables/{table.pk}/").content.decode()
    peak = table.coverage["conditioning_summary"]["max_relative_change"]
    text = f"{peak:.2%}"
    assert f"largest published change {text}" in html and f"max change {text}" in html
