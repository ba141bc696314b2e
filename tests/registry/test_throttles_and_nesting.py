"""Issue 17, items 8 and 9: lookups refuse NUL names and deep nesting with a 400 on every
path; throttles on sign-in, upload, lookup and job creation come from the environment and
hold end to end (R44)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client
from rest_framework.test import APIClient

pytestmark = pytest.mark.django_db

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("field", ["hardware", "model", "variant"])
def test_it_answers_400_for_a_nul_in_a_name(client: Client, field: str) -> None:
    """Issue 17 item 8: a NUL in hardware or model answered 500 on PostgreSQL."""
    body = {
        "hardware": "H200",
        "model": "m",
        "variant": "bf16",
        "target": {"tp": 1, "dp": 1, "rank": 0},
        "queries": [],
    }
    body[field] = "x\u0000y"
    for headers in ({}, {"HTTP_AUTHORIZATION": "Token nope"}, {"HTTP_COOKIE": "a=b"}):
        response = client.post(
            "/api/v1/lookup", json.dumps(body), content_type="application/json", **headers
        )
        if "HTTP_AUTHORIZATION" in headers:
            assert response.status_code == 401
            continue
        assert response.status_code == 400, response.content
        assert "without NUL" in response.content.decode()


def _nested(depth: int, where: str, bundle: int) -> str:
    nest = "[" * depth + "]" * depth
    base = json.dumps(
        {
            "bundle": bundle,
            "target": {"tp": 1, "dp": 1, "rank": 0},
            "queries": [{"component": "gate_routing", "tokens": 4}],
        }
    )
    if where == "body":
        return nest
    if where == "query":
        return base.replace('"tokens": 4', '"tokens": ' + nest)
    if where == "target":
        return base.replace('"rank": 0', '"rank": ' + nest)
    return base.replace(f'"bundle": {bundle}', '"hardware": ' + nest)


@pytest.mark.parametrize("depth", [1000, 10_000])
@pytest.mark.parametrize("where", ["body", "query", "target", "name"])
def test_it_answers_deep_nesting_the_same_on_every_path_never_500(
    published: Any,
    depth: int,
    where: str,
    settings: Any,
) -> None:
    """Issue 17 item 8: 1,000 deep answered 500 on the DRF path and 200 on the plain one;
    10,000 deep, 500 on every path. The short path, the DRF view (a cookie), and the DRF view
    with a throttle configured give one answer, and it is never a server error."""
    body = _nested(depth, where, published.pk)
    answers = set()
    for path in ("plain", "cookie", "throttled"):
        settings.REGISTRY = {
            **settings.REGISTRY,
            "LOOKUP_THROTTLE": "1000/second" if path == "throttled" else None,
        }
        client = Client(raise_request_exception=False)
        headers = {"HTTP_COOKIE": "x=y"} if path == "cookie" else {}
        response = client.post("/api/v1/lookup", body, content_type="application/json", **headers)
        assert response.status_code < 500, (path, response.content[:200])
        answers.add(response.status_code)
    assert len(answers) == 1, answers
    if depth == 10_000 or where in ("body", "target", "name"):
        assert answers == {400}


def test_it_answers_400_for_deep_nesting_on_other_json_endpoints(uploader: APIClient) -> None:
    """Issue 17 item 8: the same parser for every DRF endpoint (jobs take JSON)."""
    response = uploader.post(
        "/api/v1/jobs/", "[" * 10_000 + "]" * 10_000, content_type="application/json"
    )
    assert response.status_code == 400
    assert "nested too deeply" in response.json()["detail"]


def test_it_reads_the_lookup_throttle_from_the_environment_end_to_end(tmp_path: Path) -> None:
    """Issue 17 item 8: REGISTRY_LOOKUP_THROTTLE never reached the setting the code reads
    (the tests set the inner key directly, which hid it). A fresh process with only the
    environment variable throttles the third request of a minute."""
    script = (
        "import django, json; django.setup()\n"
        "from django.conf import settings; from django.test import Client\n"
        "c = Client()\n"
        "codes = [c.post('/api/v1/lookup', '{}', content_type='application/json')"
        " for _ in range(3)]\n"
        "codes = [(r.status_code, r.json().get('error', 'throttled')) for r in codes]\n"
        "print(json.dumps([settings.REGISTRY['LOOKUP_THROTTLE'], codes]))\n"
    )
    env = {
        **os.environ,
        "REGISTRY_LOOKUP_THROTTLE": "2/minute",
        "PYTHONPATH": str(REPO),
        "DJANGO_SETTINGS_MODULE": "config.settings",
        "REGISTRY_VAR_DIR": str(tmp_path),
        "DJANGO_ALLOWED_HOSTS": "testserver",
    }
    env.pop("REDIS_URL", None)
    out = subprocess.run(
        [sys.executable, "-c", script],
        env=env,
        cwd=REPO,
        text=True,
        capture_output=True,
        timeout=120,
        check=True,
    ).stdout
    rate, codes = json.loads(out.strip().splitlines()[-1])
    assert rate == "2/minute"
    assert codes == [[400, "invalid"], [400, "invalid"], [429, "throttled"]]


def test_it_throttles_uploads_and_job_creation(
    uploader: APIClient,
    settings: Any,
) -> None:
    """Issue 17 item 9: upload and job creation rates (REGISTRY_UPLOAD_THROTTLE, _JOB_)."""
    settings.REGISTRY = {**settings.REGISTRY, "UPLOAD_THROTTLE": "2/hour", "JOB_THROTTLE": "1/hour"}
    codes = [
        uploader.post(
            "/api/v1/bundles/", {"archive": SimpleUploadedFile("a", b"x")}, format="multipart"
        ).status_code
        for _ in range(3)
    ]
    assert codes == [400, 400, 429]
    assert uploader.get("/api/v1/bundles/").status_code == 200  # reads are not counted
    codes = [
        uploader.post("/api/v1/jobs/", {"model": "no/such"}, format="json").status_code
        for _ in range(2)
    ]
    assert codes == [400, 429]


def test_it_refuses_even_the_right_password_after_too_many_wrong_ones(settings: Any) -> None:
    """Issue 17 item 9: 30 wrong passwords, then the right one worked."""
    settings.REGISTRY = {**settings.REGISTRY, "SIGNIN_THROTTLE": "5/minute"}
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    get_user_model().objects.create_user("victim", password="right-one")
    client = Client()
    for _ in range(5):
        response = client.post("/accounts/login/", {"username": "victim", "password": "nope"})
        assert response.status_code == 200  # the form again, with its error
    response = client.post("/accounts/login/", {"username": "victim", "password": "right-one"})
    assert response.status_code == 200 and "_auth_user_id" not in client.session
    admin = client.post("/admin/login/", {"username": "victim", "password": "right-one"})
    assert admin.status_code == 200 and "_auth_user_id" not in client.session
    # Another address is not held up by this one's failures.
    other = Client(REMOTE_ADDR="10.0.0.9")
    response = other.post("/accounts/login/", {"username": "victim", "password": "right-one"})
    assert response.status_code == 302 and "_auth_user_id" in other.session


@pytest.mark.parametrize("value", [32768, 2**63, 2**64 + 1])
@pytest.mark.parametrize("field", ["tp", "dp", "rank"])
def test_it_answers_a_target_beyond_the_columns_without_asking_the_database(
    client: Client,
    published: Any,
    field: str,
    value: int,
) -> None:
    """Issue 17 item 8: a TP past 64 bits was sent to SQLite (OverflowError, a 500)."""
    target = {"tp": 1, "dp": 2, "rank": 0, field: value}
    for name in (
        {"bundle": published.pk},
        {"hardware": published.hardware, "model": published.model, "variant": published.variant},
    ):
        response = client.post(
            "/api/v1/lookup",
            json.dumps({**name, "target": target, "queries": []}),
            content_type="application/json",
        )
        assert response.status_code in (400, 422), response.content
