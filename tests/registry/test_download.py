"""Downloads: the whole bundle as .tar.gz with its sha256 as ETag, and single files."""

from __future__ import annotations

import io
import tarfile
from typing import TYPE_CHECKING, Any

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from registry.bundles.models import Bundle
from registry.bundles.services import publish_bundle

if TYPE_CHECKING:
    from pathlib import Path

    from rest_framework.test import APIClient

pytestmark = pytest.mark.django_db


def download(api: APIClient, bundle: Bundle, **headers: str) -> tuple[int, dict[str, str], bytes]:
    response = api.get(f"/api/v1/bundles/{bundle.pk}/download", headers=headers)
    body = b"".join(response.streaming_content) if response.status_code == 200 else b""
    return response.status_code, dict(response.headers), body


def test_it_streams_the_bundle_as_tar_gz(api: APIClient, published: Bundle, shipped: Path) -> None:
    status, headers, body = download(api, published)
    assert status == 200
    assert headers["Content-Type"] == "application/gzip"
    assert headers["ETag"] == f'"{published.sha256}"'
    assert headers["Content-Disposition"] == (
        'attachment; filename="RTXPRO6000_Qwen--Qwen3-30B-A3B-Instruct-2507_bf16_vllm-modular_'
        f'{published.sha256[:12]}.tar.gz"'
    )
    with tarfile.open(fileobj=io.BytesIO(body), mode="r:gz") as tar:
        members = {m.name.split("/", 1)[1]: m for m in tar.getmembers()}
        assert sorted(members) == sorted(r["path"] for r in published.manifest)
        for rel, info in members.items():
            handle = tar.extractfile(info)
            assert handle is not None
            assert handle.read() == (shipped / rel).read_bytes()


def test_it_gives_the_same_bytes_every_time(api: APIClient, published: Bundle) -> None:
    assert download(api, published)[2] == download(api, published)[2]


def test_it_answers_304_when_the_client_has_it(api: APIClient, published: Bundle) -> None:
    etag = f'"{published.sha256}"'
    for header in (etag, f"W/{etag}", f'"other", {etag}', "*"):
        status, headers, body = download(api, published, if_none_match=header)
        assert (status, body) == (304, b"")
        assert headers["ETag"] == etag
    assert download(api, published, if_none_match='"something-else"')[0] == 200


def test_it_gives_the_same_hash_on_download_then_upload(
    api: APIClient,
    uploader: APIClient,
    published: Bundle,
) -> None:
    _, _, archive = download(api, published)
    response = uploader.post(
        "/api/v1/bundles/",
        {"archive": SimpleUploadedFile("again.tar.gz", archive)},
        format="multipart",
    )
    assert response.status_code == 200, response.json()
    body = response.json()
    assert body["created"] is False
    assert body["sha256"] == published.sha256
    assert body["id"] == published.pk
    assert Bundle.objects.count() == 1


def test_it_serves_each_file_byte_for_byte(
    api: APIClient,
    published: Bundle,
    shipped: Path,
) -> None:
    table = published.tables.first()
    assert table is not None
    response = api.get(f"/api/v1/bundles/{published.pk}/files/{table.table_path}")
    assert response.status_code == 200
    assert b"".join(response.streaming_content) == (shipped / table.table_path).read_bytes()
    assert response["ETag"] == f'"{table.table_sha256}"'
    assert response["Content-Type"] == "text/csv"
    meta = api.get(f"/api/v1/bundles/{published.pk}/files/meta.yaml")
    assert meta["Content-Type"] == "application/yaml"
    assert b"".join(meta.streaming_content) == (shipped / "meta.yaml").read_bytes()
    again = api.get(
        f"/api/v1/bundles/{published.pk}/files/meta.yaml", headers={"if-none-match": meta["ETag"]}
    )
    assert again.status_code == 304


def test_it_answers_404_for_files_and_bundles_it_does_not_have(
    api: APIClient,
    published: Bundle,
) -> None:
    assert api.get(f"/api/v1/bundles/{published.pk}/files/tp1/skew_fit.csv").status_code == 404
    assert api.get(f"/api/v1/bundles/{published.pk}/files/../meta.yaml").status_code == 404
    assert api.get(f"/api/v1/bundles/{published.pk + 1}/download").status_code == 404
    assert api.get(f"/api/v1/bundles/{published.pk + 1}/files/meta.yaml").status_code == 404


@pytest.mark.django_db
def test_it_exports_for_other_simulators_or_names_what_cannot_be(
    api: APIClient,
    published: Bundle,
) -> None:
    """Issue 13.3: a download per format; a refusal names what the format cannot express."""
    response = api.get(f"/api/v1/bundles/{published.pk}/export/llmservingsim")
    assert response.status_code == 200
    assert response["Content-Disposition"].endswith('_llmservingsim.tar.gz"')
    with tarfile.open(fileobj=io.BytesIO(response.content), mode="r:gz") as tar:
        names = tar.getnames()
    assert any(n.endswith("/meta.yaml") for n in names)
    assert any(n.endswith("/tp1/moe_components.json") for n in names)
    response = api.get(f"/api/v1/bundles/{published.pk}/export/aiconfigurator")
    assert response.status_code == 200
    with tarfile.open(fileobj=io.BytesIO(response.content), mode="r:gz") as tar:
        assert any(n.endswith("moe/vllm/0.28.0/moe_perf.txt") for n in tar.getnames())
    assert api.get(f"/api/v1/bundles/{published.pk}/export/nope").status_code == 404


@pytest.mark.django_db
def test_an_export_a_format_cannot_hold_is_refused_with_its_reasons(
    api: APIClient,
    make_bundle: Any,
) -> None:
    bundle = publish_bundle(make_bundle(adapter="torch-reference")).bundle
    response = api.get(f"/api/v1/bundles/{bundle.pk}/export/aiconfigurator")
    assert response.status_code == 422
    assert any("ran no vLLM" in p for p in response.json()["problems"])
