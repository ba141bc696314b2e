"""POST /api/v1/bundles/: token-only uploads; 201 new, 200 identical, 400 with every problem."""

from __future__ import annotations

import shutil
from typing import TYPE_CHECKING, Any

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from registry.bundles.models import Bundle

if TYPE_CHECKING:
    from pathlib import Path

    from rest_framework.test import APIClient

pytestmark = pytest.mark.django_db


def upload(api: APIClient, data: bytes, name: str = "bundle.tar.gz") -> Any:
    return api.post(
        "/api/v1/bundles/", {"archive": SimpleUploadedFile(name, data)}, format="multipart"
    )


def test_it_creates_a_bundle_from_an_upload(
    uploader: APIClient,
    shipped: Path,
    tar_gz_of: Any,
) -> None:
    response = upload(uploader, tar_gz_of(shipped))
    assert response.status_code == 201, response.json()
    body = response.json()
    bundle = Bundle.objects.get()
    assert body["id"] == bundle.pk and body["created"] is True
    assert response["Location"] == body["url"]
    assert body["source"] == "upload" and body["source_detail"] == "bundle.tar.gz"
    assert body["published_by"] == "uploader"
    assert body["missing_files"] == ["tp1/skew_fit.csv", "tp2/skew_fit.csv"]
    assert len(body["tables"]) == 2


def test_it_returns_the_existing_bundle_for_identical_content(
    uploader: APIClient,
    shipped: Path,
    tar_gz_of: Any,
) -> None:
    first = upload(uploader, tar_gz_of(shipped, prefix="one"))
    second = upload(uploader, tar_gz_of(shipped, prefix="two"), name="renamed.tgz")
    assert (first.status_code, second.status_code) == (201, 200)
    assert second.json()["id"] == first.json()["id"]
    assert second.json()["created"] is False
    assert "Location" not in second


def test_it_reports_left_out_artifacts(
    uploader: APIClient,
    make_bundle: Any,
    tar_gz_of: Any,
) -> None:
    folder = make_bundle()
    (folder / "tp1" / "moe_components" / "dp1_ep1_rank0_sp0" / "samples.jsonl").write_text("{}\n")
    body = upload(uploader, tar_gz_of(folder)).json()
    assert body["left_out"] == ["tp1/moe_components/dp1_ep1_rank0_sp0/samples.jsonl"]


def test_it_needs_a_token(
    api: APIClient,
    shipped: Path,
    registry_dirs: Path,
    tar_gz_of: Any,
    stored_files: Any,
) -> None:
    response = upload(api, tar_gz_of(shipped))
    assert response.status_code == 401
    assert Bundle.objects.count() == 0 and stored_files(registry_dirs) == []
    api.credentials(HTTP_AUTHORIZATION="Token not-a-real-token")
    assert upload(api, tar_gz_of(shipped)).status_code == 401


def test_it_refuses_session_logins_for_uploads(
    api: APIClient,
    shipped: Path,
    django_user_model: Any,
    tar_gz_of: Any,
) -> None:
    user = django_user_model.objects.create_user("someone", password="pw")
    api.force_login(user)
    assert upload(api, tar_gz_of(shipped)).status_code == 401


def test_it_lists_every_problem_of_an_invalid_bundle(
    uploader: APIClient,
    shipped: Path,
    tmp_path: Path,
    registry_dirs: Path,
    tar_gz_of: Any,
    stored_files: Any,
) -> None:
    copy = shutil.copytree(shipped, tmp_path / "bf16")
    for table in copy.rglob("components.csv"):
        table.write_bytes(table.read_bytes().replace(b"eager", b"EAGER", 1))
    response = upload(uploader, tar_gz_of(copy))
    assert response.status_code == 400
    problems = response.json()["problems"]
    assert len(problems) == 2
    assert all("table checksum mismatch" in p for p in problems)
    assert Bundle.objects.count() == 0 and stored_files(registry_dirs) == []


def test_it_explains_an_upload_that_is_not_an_archive(uploader: APIClient) -> None:
    response = upload(uploader, b"hello", name="bundle.tar.gz")
    assert response.status_code == 400
    assert response.json() == {
        "problems": ["not a .tar.gz or .zip archive (unrecognized leading bytes)"]
    }


def test_it_asks_for_the_archive_field(uploader: APIClient) -> None:
    wrong_field = {"file": SimpleUploadedFile("x", b"")}
    response = uploader.post("/api/v1/bundles/", wrong_field, format="multipart")
    assert response.status_code == 400
    assert "archive" in response.json()["problems"][0]
    assert uploader.post("/api/v1/bundles/", {"a": 1}, format="json").status_code == 415


def test_it_refuses_an_archive_over_the_size_limit(
    uploader: APIClient,
    shipped: Path,
    settings: Any,
    tar_gz_of: Any,
) -> None:
    settings.REGISTRY = {**settings.REGISTRY, "MAX_ARCHIVE_BYTES": 1000}
    response = upload(uploader, tar_gz_of(shipped))
    assert response.status_code == 400
    assert "the limit is 1000" in response.json()["problems"][0]
