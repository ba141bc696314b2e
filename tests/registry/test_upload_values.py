"""Issue 17, items 3 and 5: every value checked before the transaction, a 400 naming the
field, and nothing committed or stored; the same answer on SQLite and PostgreSQL (R44)."""

from __future__ import annotations

import hashlib
import io
import tarfile
import zipfile
from typing import TYPE_CHECKING, Any

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.db import DatabaseError, IntegrityError, connection, transaction

from registry.audit import StateChange
from registry.bundles.services import PublishError, publish_bundle
from registry.checks import check_row
from registry.models import Bundle, DeploymentTable, Namespace

if TYPE_CHECKING:
    from pathlib import Path

    from rest_framework.test import APIClient

pytestmark = pytest.mark.django_db


def upload(api: APIClient, data: bytes, name: str = "b.tar.gz") -> Any:
    return api.post(
        "/api/v1/bundles/", {"archive": SimpleUploadedFile(name, data)}, format="multipart"
    )


def refused(response: Any, words: str, stored_files: Any, var: Path) -> str:
    """The answer is a 400 whose problems contain ``words``, and nothing at all was kept."""
    assert response.status_code == 400, response.content[:500]
    problems = " | ".join(response.json()["problems"])
    assert words in problems, problems
    assert Bundle.objects.count() == 0 and DeploymentTable.objects.count() == 0
    assert Namespace.objects.count() == 0 and StateChange.objects.count() == 0
    assert stored_files(var) == []
    return problems


@pytest.mark.parametrize(
    "when", ["0001-01-01T00:00:00+14:00", "9999-12-31T23:59:59-14:00", "1969-12-31T23:59:59+00:00"]
)
def test_it_refuses_a_measured_at_out_of_range_naming_the_field(
    uploader: APIClient,
    make_bundle: Any,
    tar_gz_of: Any,
    stored_files: Any,
    registry_dirs: Path,
    when: str,
) -> None:
    """Issue 17 item 3: it was committed, answered 500, then broke every list for everyone."""
    folder = make_bundle(coverage={"measured_at": when})
    problems = refused(
        upload(uploader, tar_gz_of(folder)), "coverage:measured_at", stored_files, registry_dirs
    )
    assert "outside" in problems
    assert uploader.get("/api/v1/bundles/").status_code == 200


def test_it_keeps_a_bad_time_out_of_the_database_itself(published: Bundle) -> None:
    """Issue 17 item 3: a guard below the application: the table refuses an unreadable time,
    so no row can make list, detail, download, files or lookup answer 500."""
    bad = "10000-01-01 00:00:00+00" if connection.vendor == "postgresql" else "0000-12-31 10:00:00"
    with pytest.raises(IntegrityError), transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            "UPDATE registry_bundle SET measured_at = %s WHERE id = %s", [bad, published.pk]
        )


@pytest.mark.parametrize(
    ("meta", "words"),
    [
        ({"hardware": "GPU\x00X"}, "meta.yaml:hardware contains a NUL"),
        ({"notes": "a\x00b"}, "meta.yaml.notes: contains a NUL"),
        ({"notes": {"k\x00": 1}}, "meta.yaml.notes: a key contains a NUL"),
        ({"vllm_version": "0.26\x00"}, "vllm_version"),
        ({"variant": "x" * 200}, "meta.yaml:variant"),
    ],
)
def test_it_refuses_text_that_cannot_be_stored(
    uploader: APIClient,
    make_bundle: Any,
    tar_gz_of: Any,
    stored_files: Any,
    registry_dirs: Path,
    meta: dict[str, Any],
    words: str,
) -> None:
    """Issue 17 item 5: NUL and lone surrogates answered 500 on PostgreSQL and left blobs."""
    folder = make_bundle(meta=meta)
    refused(upload(uploader, tar_gz_of(folder)), words, stored_files, registry_dirs)


def test_it_refuses_a_lone_surrogate_in_meta_yaml(
    uploader: APIClient,
    make_bundle: Any,
    tar_gz_of: Any,
    stored_files: Any,
    registry_dirs: Path,
) -> None:
    """Issue 17 item 5: a YAML escape of a lone surrogate (libyaml refuses it as YAML)."""
    folder = make_bundle()
    meta = folder / "meta.yaml"
    text = meta.read_text()
    assert "model: synthetic/moe-8e" in text
    meta.write_text(text.replace("model: synthetic/moe-8e", 'model: "m\\ud800x"'))
    refused(upload(uploader, tar_gz_of(folder)), "invalid Unicode", stored_files, registry_dirs)


def test_it_refuses_counts_beyond_their_columns(
    uploader: APIClient,
    make_bundle: Any,
    tar_gz_of: Any,
    stored_files: Any,
    registry_dirs: Path,
) -> None:
    """Issue 17 item 5: token counts of 2^31 or more did not fit an integer column."""
    folder = make_bundle(rows=[("gate_routing", "eager", 2**31, -1, -1, 9.0)])
    refused(
        upload(uploader, tar_gz_of(folder)),
        "local_tokens_max = 2147483648 is outside",
        stored_files,
        registry_dirs,
    )


def test_it_checks_every_column_type_the_same_on_every_backend() -> None:
    """Issue 17 item 5: TP, DP, EP or rank above 32767 (a smallint column)."""
    table = DeploymentTable(
        tp=40000,
        dp=1,
        ep=40000,
        rank=32768,
        sequence_parallel=False,
        table_path="t.csv",
        table_sha256="0" * 64,
        contract={},
        coverage={},
        components=[],
        modes=[],
        row_count=-1,
    )
    problems = check_row(table, "tp40000/t.csv")
    assert any("tp = 40000 is outside 0..32767" in p for p in problems)
    assert any("rank = 32768" in p for p in problems)
    assert any("row_count = -1" in p for p in problems)


def _with_table_edit(folder: Path, old: bytes, new: bytes) -> None:
    """Edit components.csv and re-declare its checksum, so that only the edit is wrong."""
    table = next(folder.rglob("components.csv"))
    before = table.read_bytes()
    after = before.replace(old, new, 1)
    assert after != before
    table.write_bytes(after)
    meta = folder / "meta.yaml"
    meta.write_bytes(
        meta.read_bytes().replace(
            hashlib.sha256(before).hexdigest().encode(), hashlib.sha256(after).hexdigest().encode()
        )
    )


@pytest.mark.parametrize("number", ["7_5", "١", "１", "0x10"])
def test_it_reads_csv_numbers_as_plain_ascii_decimals_only(
    uploader: APIClient,
    make_bundle: Any,
    tar_gz_of: Any,
    stored_files: Any,
    registry_dirs: Path,
    number: str,
) -> None:
    """Issue 17 item 5: int() and float() read 7_5, Arabic-Indic and fullwidth digits."""
    folder = make_bundle()
    _with_table_edit(folder, b"gate_routing,eager,1,", f"gate_routing,eager,{number},".encode())
    refused(upload(uploader, tar_gz_of(folder)), "plain ASCII decimal", stored_files, registry_dirs)
    folder = make_bundle()
    _with_table_edit(folder, b",5.1\n", f",{number}\n".encode())
    refused(
        upload(uploader, tar_gz_of(folder)), "time_us must be a number", stored_files, registry_dirs
    )


def test_it_refuses_a_meta_yaml_that_is_not_utf8(
    uploader: APIClient,
    make_bundle: Any,
    tar_gz_of: Any,
    stored_files: Any,
    registry_dirs: Path,
) -> None:
    """Issue 17 item 5: PyYAML would read UTF-16 too."""
    folder = make_bundle()
    meta = folder / "meta.yaml"
    meta.write_bytes(meta.read_text().encode("utf-16"))
    refused(
        upload(uploader, tar_gz_of(folder)), "meta.yaml: is not UTF-8", stored_files, registry_dirs
    )


def _tar_gz(members: list[tuple[bytes, bytes]], tail: bytes = b"") -> bytes:
    raw = io.BytesIO()
    with tarfile.open(
        fileobj=raw, mode="w", format=tarfile.GNU_FORMAT, encoding="utf-8", errors="surrogateescape"
    ) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name.decode("utf-8", "surrogateescape"))
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    buffer = io.BytesIO()
    import gzip

    with gzip.GzipFile(fileobj=buffer, mode="wb") as gz:
        gz.write(raw.getvalue() + tail)
    return buffer.getvalue()


def _members(folder: Path) -> list[tuple[bytes, bytes]]:
    return [
        (p.relative_to(folder).as_posix().encode(), p.read_bytes())
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    ]


def test_it_refuses_member_names_that_are_not_utf8(
    uploader: APIClient,
    make_bundle: Any,
    stored_files: Any,
    registry_dirs: Path,
) -> None:
    """Issue 17 item 5: a tar or zip member name that is not UTF-8 answered 500."""
    members = [*_members(make_bundle()), (b"notes-\xff.md", b"x")]
    refused(upload(uploader, _tar_gz(members)), "not UTF-8", stored_files, registry_dirs)
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, data in members:
            archive.writestr(name.replace(b"\xff", b"@").decode(), data)
    # zipfile writes non-ASCII names as UTF-8 (flag 0x800); the raw byte 0xff is no UTF-8.
    raw = buffer.getvalue().replace(b"notes-@.md", b"notes-\xff.md")
    refused(upload(uploader, raw, "b.zip"), "not UTF-8", stored_files, registry_dirs)


def test_it_refuses_a_damaged_tar_header_after_the_table(
    uploader: APIClient,
    make_bundle: Any,
    stored_files: Any,
    registry_dirs: Path,
) -> None:
    """Issue 17 item 5: it silently dropped the members after the bad block and answered 201."""
    members = [*_members(make_bundle()), (b"zz-notes.md", b"notes\n")]
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name.decode())
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    data = bytearray(raw.getvalue())
    last = data.rfind(b"zz-notes.md")
    data[last + 148 : last + 156] = b"XXXXXXX\0"  # the header checksum field
    import gzip

    refused(
        upload(uploader, gzip.compress(bytes(data))),
        "damaged tar header",
        stored_files,
        registry_dirs,
    )


@pytest.mark.parametrize("junk", [b"junk", b"\0" * 512 + b"x", b"<script>alert(1)</script>"])
def test_it_refuses_data_after_the_tar_end_marker(
    uploader: APIClient,
    make_bundle: Any,
    stored_files: Any,
    registry_dirs: Path,
    junk: bytes,
) -> None:
    """Issue 17 item 5: 103 random mutations were accepted with junk after the end marker."""
    refused(
        upload(uploader, _tar_gz(_members(make_bundle()), tail=junk)),
        "after the tar end marker",
        stored_files,
        registry_dirs,
    )


def test_it_accepts_zero_padding_after_the_end_marker(
    uploader: APIClient,
    make_bundle: Any,
) -> None:
    """Issue 17 item 5: padding is what tar writes; only data is refused."""
    response = upload(uploader, _tar_gz(_members(make_bundle()), tail=b"\0" * 10240))
    assert response.status_code == 201, response.content


def test_it_leaves_nothing_behind_when_the_database_fails_mid_publication(
    make_bundle: Any,
    stored_files: Any,
    registry_dirs: Path,
    monkeypatch: Any,
) -> None:
    """Issue 17 item 5: blobs written before a failed commit are swept."""

    def fail(*args: Any, **kwargs: Any) -> Any:
        raise DatabaseError("the database went away")

    monkeypatch.setattr(DeploymentTable.objects, "bulk_create", fail)
    with pytest.raises(DatabaseError):
        publish_bundle(make_bundle())
    assert Bundle.objects.count() == 0
    assert stored_files(registry_dirs) == []


def test_it_keeps_blobs_another_bundle_names_when_a_publication_fails(
    make_bundle: Any,
    stored_files: Any,
    registry_dirs: Path,
    monkeypatch: Any,
    shipped: Path,
) -> None:
    """Issue 17 item 5: the sweep removes only what no committed bundle names."""
    import shutil

    first = publish_bundle(shipped).bundle
    before = sorted(stored_files(registry_dirs))
    copy = registry_dirs.parent / "copy"
    shutil.copytree(shipped, copy)
    (copy / "notes.md").write_text("one more file\n")

    def fail(*args: Any, **kwargs: Any) -> Any:
        raise DatabaseError("the database went away")

    monkeypatch.setattr(DeploymentTable.objects, "bulk_create", fail)
    with pytest.raises(DatabaseError):
        publish_bundle(copy)
    assert sorted(stored_files(registry_dirs)) == before
    assert list(Bundle.objects.all()) == [first]


def test_it_names_every_problem_before_anything_is_written() -> None:
    """Issue 17 item 5: PublishError lists problems; it is what the API turns into a 400."""
    assert issubclass(PublishError, Exception)
