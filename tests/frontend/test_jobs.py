"""Jobs pages through the Django test client (the real worker run is in test_browser.py)."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from registry.models import AcquisitionJob

pytestmark = pytest.mark.django_db


@pytest.fixture
def signed_in(client: Client) -> Client:
    user = get_user_model().objects.create_user("alice", password="x")
    client.force_login(user)
    return client


def test_it_asks_anonymous_people_to_sign_in_before_queueing(client: Client) -> None:
    response = client.get("/jobs/new")
    assert response.status_code == 302 and "/accounts/login/" in response["Location"]
    assert client.post("/jobs/new", {"model": "x"}).status_code == 302
    assert AcquisitionJob.objects.count() == 0


def test_it_refuses_what_the_cli_refuses_field_by_field(signed_in: Client) -> None:
    response = signed_in.post(
        "/jobs/new", {"model": "no/such-model", "hardware": "CPU", "rounds": "many"}
    )
    assert response.status_code == 400
    html = response.content.decode()
    assert 'id="e-model"' in html and "unknown model" in html
    assert 'id="e-rounds"' in html
    assert AcquisitionJob.objects.count() == 0


def test_it_queues_shows_and_cancels_a_job(signed_in: Client, settings: Any) -> None:
    response = signed_in.post(
        "/jobs/new",
        {
            "model": "Qwen/Qwen3-30B-A3B-Instruct-2507",
            "hardware": "CPU",
            "device": "cpu",
            "backend": "torch-reference",
            "cudagraph_mode": "NONE",
            "tp": "1",
            "cache_bytes": "",
        },
    )
    assert response.status_code == 302, response.content.decode()[:2000]
    job = AcquisitionJob.objects.get()
    assert response["Location"] == f"/jobs/{job.pk}/"
    assert job.queue == "cpu" and job.parameters["cache_bytes"] is None
    html = signed_in.get(f"/jobs/{job.pk}/").content.decode()
    assert "queued" in html and 'hx-trigger="every 1s"' in html and "job-cancel" in html
    assert f"/jobs/{job.pk}/" in signed_in.get("/").content.decode()
    assert signed_in.get(f"/jobs/{job.pk}/progress").status_code == 200
    response = signed_in.post(f"/jobs/{job.pk}/cancel")
    assert response.status_code == 302
    job.refresh_from_db()
    assert job.state == "cancelled"
    html = signed_in.get(f"/jobs/{job.pk}/progress").content.decode()
    assert "every 1s" not in html  # finished jobs are not polled
    html = signed_in.post(f"/jobs/{job.pk}/cancel", follow=True).content.decode()
    assert "only queued or running" in html


def test_it_shows_a_failed_job_with_its_error_and_artifacts(client: Client) -> None:
    job = AcquisitionJob.objects.create(
        parameters={"model": "m", "hardware": "CPU", "command": "slice"},
        queue="cpu",
        state="failed",
        phase="failed",
        error="attribution check failed at N=4",
        work_dir="/var/jobs/job-1",
        points_done=3,
        points_total=10,
        artifacts=[{"name": "failures.jsonl", "path": "out/failures.jsonl", "size": 120}],
    )
    html = client.get(f"/jobs/{job.pk}/").content.decode()
    assert "attribution check failed at N=4" in html and "out/failures.jsonl" in html
    assert f"/api/v1/jobs/{job.pk}/artifacts/failures.jsonl" in html  # downloadable
    assert "30%" in html
    assert "job-cancel" not in html


def test_it_signs_people_in_on_its_own_page(client: Client) -> None:
    get_user_model().objects.create_user("bob", password="s3cret-pass")
    page = client.get("/accounts/login/?next=/jobs/new")
    assert page.status_code == 200 and b"Sign in" in page.content
    response = client.post(
        "/accounts/login/", {"username": "bob", "password": "s3cret-pass", "next": "/jobs/new"}
    )
    assert response.status_code == 302 and response["Location"] == "/jobs/new"
    assert client.get("/jobs/new").status_code == 200
    wrong = Client().post("/accounts/login/", {"username": "bob", "password": "nope"})
    assert wrong.status_code == 200 and b"did not match" in wrong.content
