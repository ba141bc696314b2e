"""Issue 17, item 4: hostile YAML and geometry are refused quickly over HTTP, and each
account's published bytes are bounded by a quota setting (R44)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from registry.bundles.models import Bundle
from tests.moetables.test_bounded_yaml import LAUGHS

if TYPE_CHECKING:
    from pathlib import Path

    from rest_framework.test import APIClient

pytestmark = pytest.mark.django_db


def upload(api: APIClient, data: bytes) -> Any:
    return api.post(
        "/api/v1/bundles/", {"archive": SimpleUploadedFile("b.tar.gz", data)}, format="multipart"
    )


def test_it_refuses_a_billion_laughs_meta_yaml_in_well_under_a_second(
    uploader: APIClient,
    make_bundle: Any,
    tar_gz_of: Any,
    stored_files: Any,
    registry_dirs: Path,
) -> None:
    """Issue 17 item 4: it took 46 s and 3.6 GB, then was accepted."""
    folder = make_bundle()
    meta = folder / "meta.yaml"
    meta.write_bytes(
        meta.read_bytes()
        + b"laughs:\n"
        + b"".join(b"  " + line + b"\n" for line in LAUGHS.splitlines())
    )
    start = time.perf_counter()
    response = upload(uploader, tar_gz_of(folder))
    assert time.perf_counter() - start < 3.0
    assert response.status_code == 400
    assert "aliases" in " ".join(response.json()["problems"])
    assert Bundle.objects.count() == 0 and stored_files(registry_dirs) == []


def test_it_refuses_fifty_million_experts_quickly(
    uploader: APIClient,
    make_bundle: Any,
    tar_gz_of: Any,
) -> None:
    """Issue 17 item 4: global_experts 5e7 took 4 s and 2 GB."""
    folder = make_bundle()
    meta = folder / "meta.yaml"
    meta.write_text(meta.read_text().replace("global_experts: 8", "global_experts: 50000000"))
    start = time.perf_counter()
    response = upload(uploader, tar_gz_of(folder))
    assert time.perf_counter() - start < 3.0
    assert response.status_code == 400
    assert "global_experts: must be within 1..65536" in " ".join(response.json()["problems"])


def test_it_keeps_each_publisher_within_the_storage_quota(
    uploader: APIClient,
    make_bundle: Any,
    tar_gz_of: Any,
    settings: Any,
) -> None:
    """Issue 17 item 4: a per-user quota (REGISTRY_USER_QUOTA_BYTES); 413 past it."""
    first = upload(uploader, tar_gz_of(make_bundle(scale=1.0)))
    assert first.status_code == 201
    size = first.json()["size"]
    settings.REGISTRY = {**settings.REGISTRY, "USER_QUOTA_BYTES": int(size * 1.5)}
    second = upload(uploader, tar_gz_of(make_bundle(scale=2.0)))
    assert second.status_code == 413, second.content
    assert "quota" in second.json()["problems"][0]
    assert Bundle.objects.count() == 1
    # The same content again costs nothing: it is the bundle already there.
    assert upload(uploader, tar_gz_of(make_bundle(scale=1.0))).status_code == 200
    settings.REGISTRY = {**settings.REGISTRY, "USER_QUOTA_BYTES": 0}
    assert upload(uploader, tar_gz_of(make_bundle(scale=2.0))).status_code == 201
