"""Issue 17, item 2 (and 7, 9): one permission rule per action, for the API and the dashboard
alike, tested on every write endpoint and form as anonymous, wrong token, another user, owner
and staff; every state change names who made it (R44)."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from registry.audit import StateChange
from registry.models import AcquisitionJob, Bundle
from registry.permissions import (
    can_cancel_job,
    can_delete_bundle,
    can_publish_under,
    can_retry_job,
    can_upload,
    can_view_job_details,
)

pytestmark = pytest.mark.django_db

QWEN = "Qwen/Qwen3-30B-A3B-Instruct-2507"
WHO = ("anonymous", "wrong_token", "other", "owner", "staff")


def _user(name: str, **extra: Any) -> Any:
    return get_user_model().objects.create_user(name, **extra)  # no password: fast to make


@pytest.fixture
def people() -> dict[str, Any]:
    return {
        "owner": _user("olive"),
        "other": _user("mallory"),
        "staff": _user("sam", is_staff=True),
    }


def _api(who: str, people: dict[str, Any]) -> APIClient:
    api = APIClient()
    if who == "wrong_token":
        api.credentials(HTTP_AUTHORIZATION="Token " + "0" * 40)
    elif who in people:
        keys = people.setdefault("_keys", {})
        if who not in keys:  # keys are stored hashed: keep the one shown at creation
            keys[who] = Token.objects.create(user=people[who]).key
        api.credentials(HTTP_AUTHORIZATION=f"Token {keys[who]}")
    return api


def _web(who: str, people: dict[str, Any]) -> Client:
    client = Client()
    if who in ("owner", "other", "staff"):
        client.force_login(people[who])
    return client


def _job(owner: Any, **fields: Any) -> AcquisitionJob:
    params = {"model": QWEN, "hardware": "H200", "device": "cuda", "command": "slice"}
    return AcquisitionJob.objects.create(
        parameters=params,
        queue="gpu.H200",
        created_by=owner,
        work_dir="/srv/jobs/job-7",
        **fields,
    )


API_CANCEL = {"anonymous": 401, "wrong_token": 401, "other": 403, "owner": 200, "staff": 200}


@pytest.mark.parametrize("who", WHO)
def test_it_lets_only_the_owner_or_staff_cancel_over_the_api(
    who: str, people: dict[str, Any]
) -> None:
    """Issue 17 item 2: POST /api/v1/jobs/{id}/cancel."""
    job = _job(people["owner"])
    response = _api(who, people).post(f"/api/v1/jobs/{job.pk}/cancel")
    assert response.status_code == API_CANCEL[who], response.content
    job.refresh_from_db()
    assert (job.state == "cancelled") == (API_CANCEL[who] == 200)
    changes = list(StateChange.objects.filter(action="job.cancel"))
    if API_CANCEL[who] == 200:
        assert [(c.actor_name, c.target_id) for c in changes] == [(people[who].username, job.pk)]
    else:
        assert changes == []


# The web form: anonymous is sent to sign in; a wrong token means nothing to a browser (the
# token header is ignored by the session door), so it is anonymous there too.
WEB_CANCEL = {"anonymous": 302, "wrong_token": 302, "other": 403, "owner": 302, "staff": 302}


@pytest.mark.parametrize("who", WHO)
def test_it_lets_only_the_owner_or_staff_cancel_on_the_web(
    who: str, people: dict[str, Any]
) -> None:
    """Issue 17 item 2: POST /jobs/{id}/cancel once cancelled anyone's job; now the same rule
    as the API."""
    job = _job(people["owner"])
    client = _web(who, people)
    headers = {"HTTP_AUTHORIZATION": "Token " + "0" * 40} if who == "wrong_token" else {}
    response = client.post(f"/jobs/{job.pk}/cancel", **headers)
    assert response.status_code == WEB_CANCEL[who]
    job.refresh_from_db()
    cancelled = who in ("owner", "staff")
    assert (job.state == "cancelled") is cancelled
    if who in ("anonymous", "wrong_token"):
        assert "/accounts/login/" in response["Location"]
    assert StateChange.objects.filter(action="job.cancel").exists() is cancelled


def test_it_shows_the_cancel_button_only_to_who_may_use_it(people: dict[str, Any]) -> None:
    """Issue 17 item 2: the page asks the same rule."""
    job = _job(people["owner"])
    for who in ("anonymous", "other", "owner", "staff"):
        html = _web(who, people).get(f"/jobs/{job.pk}/").content.decode()
        assert ('id="job-cancel"' in html) is (who in ("owner", "staff")), who


API_RETRY = {"anonymous": 401, "wrong_token": 401, "other": 403, "owner": 200, "staff": 200}


@pytest.mark.parametrize("who", WHO)
def test_it_lets_only_the_owner_or_staff_retry(
    who: str,
    people: dict[str, Any],
    redis_broker: Any,
    django_capture_on_commit_callbacks: Any,
) -> None:
    """Issue 17 item 2: POST /api/v1/jobs/{id}/retry."""
    job = _job(people["owner"], state="failed", error="boom")
    with django_capture_on_commit_callbacks(execute=True):
        response = _api(who, people).post(f"/api/v1/jobs/{job.pk}/retry")
    assert response.status_code == API_RETRY[who], response.content
    job.refresh_from_db()
    assert (job.state == "queued") is (API_RETRY[who] == 200)
    recorded = StateChange.objects.filter(action="job.retry").values_list("actor_name", flat=True)
    assert list(recorded) == ([people[who].username] if API_RETRY[who] == 200 else [])


API_QUEUE = {"anonymous": 401, "wrong_token": 401, "other": 201, "owner": 201, "staff": 201}


@pytest.mark.parametrize("who", WHO)
def test_it_lets_signed_in_people_queue_jobs(
    who: str,
    people: dict[str, Any],
    redis_broker: Any,
    django_capture_on_commit_callbacks: Any,
) -> None:
    """Issue 17 item 2: POST /api/v1/jobs/ and the /jobs/new form, one rule."""
    with django_capture_on_commit_callbacks(execute=True):
        response = _api(who, people).post(
            "/api/v1/jobs/", {"model": QWEN, "hardware": "H200"}, format="json"
        )
    assert response.status_code == API_QUEUE[who], response.content
    web = _web(who, people).post("/jobs/new", {"model": QWEN, "hardware": "H200"})
    if who in ("anonymous", "wrong_token"):
        assert web.status_code == 302 and "/accounts/login/" in web["Location"]
        assert AcquisitionJob.objects.count() == 0
    else:
        assert web.status_code in (302, 503)
        job = AcquisitionJob.objects.order_by("id").first()
        assert job is not None and job.created_by == people[who]
        assert StateChange.objects.filter(action="job.queue", actor=people[who]).exists()


def _upload(api: APIClient, data: bytes) -> Any:
    return api.post(
        "/api/v1/bundles/", {"archive": SimpleUploadedFile("b.tar.gz", data)}, format="multipart"
    )


UPLOAD = {"anonymous": 401, "wrong_token": 401, "other": 403, "owner": 201, "staff": 201}


@pytest.mark.parametrize("who", WHO)
def test_it_lets_only_the_names_owner_or_staff_publish_under_it(
    who: str,
    people: dict[str, Any],
    make_bundle: Any,
    tar_gz_of: Any,
) -> None:
    """Issue 17 items 2 and 7: POST /api/v1/bundles/. The owner's first upload claims the
    hardware/model; a stranger cannot publish under it, so cannot change what it resolves to."""
    first = _upload(_api("owner", people), tar_gz_of(make_bundle(scale=1.0)))
    assert first.status_code == 201, first.json()
    response = _upload(_api(who, people), tar_gz_of(make_bundle(scale=2.0)))
    assert response.status_code == UPLOAD[who], response.content
    assert Bundle.objects.count() == (2 if UPLOAD[who] == 201 else 1)
    if UPLOAD[who] == 403:
        assert "belongs to another publisher" in response.json()["detail"]
    publishes = StateChange.objects.filter(action="bundle.publish")
    assert publishes.count() == Bundle.objects.count()


def test_it_lets_staff_grant_a_name_to_another_publisher(
    people: dict[str, Any],
    make_bundle: Any,
    tar_gz_of: Any,
) -> None:
    """Issue 17 item 7: a grant from staff opens the name to one more publisher."""
    from registry.models import Namespace, NamespaceGrant

    assert _upload(_api("owner", people), tar_gz_of(make_bundle())).status_code == 201
    namespace = Namespace.objects.get()
    assert namespace.owner == people["owner"]
    assert not can_publish_under(people["other"], namespace.hardware, namespace.model)
    NamespaceGrant.objects.create(
        namespace=namespace, user=people["other"], granted_by=people["staff"]
    )
    assert _upload(_api("other", people), tar_gz_of(make_bundle(scale=3.0))).status_code == 201


def test_it_keeps_imported_names_for_staff_and_grantees(
    people: dict[str, Any],
    published: Bundle,
    tmp_path: Any,
    tar_gz_of: Any,
    shipped: Any,
) -> None:
    """Issue 17 item 7: a name first published by the server (an import) is nobody's to take."""
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(shipped, copy)
    (copy / "notes.md").write_text("a different bundle under the same name\n")
    assert _upload(_api("owner", people), tar_gz_of(copy)).status_code == 403
    assert _upload(_api("staff", people), tar_gz_of(copy)).status_code == 201


def test_it_decides_each_rule_in_one_place(people: dict[str, Any]) -> None:
    """Issue 17 item 2: the functions the views call."""
    job = _job(people["owner"])
    anonymous = None
    owner, other, staff = people["owner"], people["other"], people["staff"]
    for check in (can_cancel_job, can_retry_job, can_view_job_details):
        assert [check(u, job) for u in (anonymous, other, owner, staff)] == [
            False,
            False,
            True,
            True,
        ]
    assert [can_upload(u) for u in (anonymous, other, owner)] == [False, True, True]
    assert [can_delete_bundle(u) for u in (anonymous, other, owner, staff)] == [
        False,
        False,
        False,
        True,
    ]
    owner.is_active = False
    assert not can_cancel_job(owner, job) and not can_upload(owner)


@pytest.mark.parametrize("who", ("anonymous", "other", "owner", "staff"))
def test_it_shows_the_work_folder_only_to_the_owner_and_staff(
    who: str,
    people: dict[str, Any],
) -> None:
    """Issue 17 item 9: an anonymous job view showed the server's work_dir."""
    job = _job(people["owner"])
    shown = who in ("owner", "staff")
    body = _api(who, people).get(f"/api/v1/jobs/{job.pk}/").json()
    assert (body["work_dir"] == "/srv/jobs/job-7") is shown
    assert ("/srv/jobs/job-7" in body["command_line"]) is shown
    html = _web(who, people).get(f"/jobs/{job.pk}/").content.decode()
    assert ("/srv/jobs/job-7" in html) is shown
    listed = _api(who, people).get("/api/v1/jobs/").json()["results"][0]
    assert ("/srv/jobs/job-7" in str(listed)) is shown


def test_it_stores_api_tokens_hashed() -> None:
    """Issue 17 item 9: a copy of the database no longer holds usable keys."""
    import io

    from django.core.management import call_command

    from registry.tokens import token_digest

    out = io.StringIO()
    call_command("upload_token", "machine", stdout=out)
    key = out.getvalue().strip()
    stored = Token.objects.get(user__username="machine").key
    assert stored == token_digest(key) and stored != key
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Token {key}")
    assert api.post("/api/v1/jobs/", {}, format="json").status_code == 400  # authenticated
    api.credentials(HTTP_AUTHORIZATION=f"Token {stored}")  # the stored value is no key
    assert api.post("/api/v1/jobs/", {}, format="json").status_code == 401
    # Running the command again replaces the token: the old key stops working.
    call_command("upload_token", "machine", stdout=io.StringIO())
    api.credentials(HTTP_AUTHORIZATION=f"Token {key}")
    assert api.post("/api/v1/jobs/", {}, format="json").status_code == 401
