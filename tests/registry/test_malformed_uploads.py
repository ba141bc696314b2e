"""Generated malformed archives: always a 400 naming the problem, never a 500, nothing stored."""

from __future__ import annotations

import gzip
import io
import tarfile
import warnings
import zipfile
from typing import TYPE_CHECKING, Any

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from registry.bundles.models import Bundle

if TYPE_CHECKING:
    from pathlib import Path

    from rest_framework.test import APIClient

pytestmark = pytest.mark.django_db

# The fixtures (a token client, an empty store) are the same for every example, and each
# example checks that it left the store empty, so sharing them across examples is sound.
EXAMPLES = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

NAMES = st.one_of(
    st.sampled_from(
        [
            "meta.yaml",
            "b/meta.yaml",
            "/etc/passwd",
            "../meta.yaml",
            "a/../../x",
            "a\\b",
            "./",
            "b/tp1/components.csv",
            "b/../b/meta.yaml",
            "C:/meta.yaml",
            "",
            ".",
            "a/\x00b",
        ]
    ),
    st.text(min_size=1, max_size=40),
)
TAR_TYPES = st.sampled_from(
    [
        tarfile.REGTYPE,
        tarfile.DIRTYPE,
        tarfile.SYMTYPE,
        tarfile.LNKTYPE,
        tarfile.CHRTYPE,
        tarfile.BLKTYPE,
        tarfile.FIFOTYPE,
        tarfile.CONTTYPE,
    ]
)
CONTENT = st.one_of(
    st.binary(max_size=300),
    st.sampled_from(
        [
            b"hardware: x\nmodel: y\nvariant: z\n",
            b"moe_components: {schema: 1}\n",
            b"- not a mapping\n",
            b"per_tp: {1: {moe_components: {schema: moe-components}}}",
        ]
    ),
)


def post(api: APIClient, data: bytes) -> Any:
    return api.post(
        "/api/v1/bundles/", {"archive": SimpleUploadedFile("x.tar.gz", data)}, format="multipart"
    )


def assert_refused_and_nothing_stored(response: Any, var: Path) -> None:
    assert response.status_code == 400, (response.status_code, response.content[:500])
    problems = response.json()["problems"]
    assert problems and all(isinstance(p, str) and p for p in problems)
    assert Bundle.objects.count() == 0
    stored = [f for f in var.rglob("*") if f.is_file() and "staging" not in f.parts]
    assert stored == []
    staging = var / "staging"
    assert not staging.exists() or list(staging.iterdir()) == []


def build_tar(members: list[tuple[str, bytes, bytes]], fmt: int) -> bytes:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=fmt) as tar:
        for name, kind, data in members:
            info = tarfile.TarInfo(name)
            info.type = kind
            if kind in (tarfile.REGTYPE, tarfile.CONTTYPE):
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
            else:
                info.linkname = "meta.yaml"
                tar.addfile(info)
    return gzip.compress(raw.getvalue())


@EXAMPLES
@given(
    data=st.one_of(
        st.binary(max_size=600),
        st.binary(max_size=600).map(lambda b: b"\x1f\x8b" + b),
        st.binary(max_size=600).map(lambda b: b"PK\x03\x04" + b),
        st.binary(max_size=600).map(gzip.compress),
    )
)
def test_it_refuses_random_bytes(uploader: APIClient, registry_dirs: Path, data: bytes) -> None:
    assert_refused_and_nothing_stored(post(uploader, data), registry_dirs)


@EXAMPLES
@given(
    members=st.lists(st.tuples(NAMES, TAR_TYPES, CONTENT), min_size=1, max_size=6),
    fmt=st.sampled_from([tarfile.PAX_FORMAT, tarfile.GNU_FORMAT]),
)
def test_it_refuses_generated_tar_archives(
    uploader: APIClient,
    registry_dirs: Path,
    members: list[tuple[str, bytes, bytes]],
    fmt: int,
) -> None:
    try:
        data = build_tar(members, fmt)
    except (ValueError, UnicodeError):
        data = b"\x1f\x8b unencodable"  # a name tarfile itself cannot write
    assert_refused_and_nothing_stored(post(uploader, data), registry_dirs)


@EXAMPLES
@given(
    members=st.lists(
        st.tuples(NAMES, st.sampled_from([0o100644, 0o120777, 0o010644, 0o040755, 0]), CONTENT),
        min_size=1,
        max_size=6,
    )
)
def test_it_refuses_generated_zip_archives(
    uploader: APIClient,
    registry_dirs: Path,
    members: list[tuple[str, int, bytes]],
) -> None:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as zf, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # duplicate names are part of what is generated
        for name, mode, data in members:
            info = zipfile.ZipInfo(name or "empty")
            info.external_attr = mode << 16
            zf.writestr(info, data)
    assert_refused_and_nothing_stored(post(uploader, buffer.getvalue()), registry_dirs)


def bundle_tar(folder: Path) -> tuple[bytes, dict[str, tuple[int, int]]]:
    """An uncompressed tar of the bundle and each member's data span in it."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        tar.add(folder, arcname="b")
    data = raw.getvalue()
    with tarfile.open(fileobj=io.BytesIO(data), mode="r") as tar:
        spans = {
            m.name: (m.offset_data, m.offset_data + m.size) for m in tar.getmembers() if m.isfile()
        }
    return data, spans


@pytest.fixture
def valid_tar(make_bundle: Any) -> tuple[bytes, dict[str, tuple[int, int]]]:
    return bundle_tar(make_bundle(dp=2))


@EXAMPLES
@given(cut=st.floats(min_value=0.0, max_value=1.0, exclude_max=True))
def test_it_refuses_a_truncated_bundle_archive(
    uploader: APIClient,
    registry_dirs: Path,
    valid_tar: tuple[bytes, dict[str, tuple[int, int]]],
    cut: float,
) -> None:
    data, spans = valid_tar
    end_of_last_file = max(end for _, end in spans.values())
    truncated = data[: int(cut * end_of_last_file)]
    assert_refused_and_nothing_stored(post(uploader, gzip.compress(truncated)), registry_dirs)


@EXAMPLES
@given(choice=st.data())
def test_it_refuses_a_bundle_with_a_changed_checksummed_byte(
    uploader: APIClient,
    registry_dirs: Path,
    valid_tar: tuple[bytes, dict[str, tuple[int, int]]],
    choice: st.DataObject,
) -> None:
    data, spans = valid_tar
    tables = sorted(name for name in spans if name.endswith("components.csv"))
    start, end = spans[choice.draw(st.sampled_from(tables))]
    position = choice.draw(st.integers(min_value=start, max_value=end - 1))
    new = choice.draw(st.integers(min_value=0, max_value=255).filter(lambda b: b != data[position]))
    changed = data[:position] + bytes([new]) + data[position + 1 :]
    assert_refused_and_nothing_stored(post(uploader, gzip.compress(changed)), registry_dirs)


def test_it_accepts_the_untouched_archive(
    uploader: APIClient,
    valid_tar: tuple[bytes, dict[str, tuple[int, int]]],
) -> None:
    """The generators above start from an archive that is itself valid."""
    assert post(uploader, gzip.compress(valid_tar[0])).status_code == 201
