"""Safe unpacking: nothing outside the folder, no links or devices, bounded size and count."""

from __future__ import annotations

import gzip
import io
import stat
import tarfile
import zipfile
from typing import TYPE_CHECKING

import pytest

from registry.archives import (
    ArchiveError,
    ArchiveLimits,
    find_bundle_root,
    iter_tar_gz,
    unpack_archive,
)

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

LIMITS = ArchiveLimits(max_archive_bytes=1 << 20, max_unpacked_bytes=1 << 16, max_files=20)


def tar_gz(*members: tuple[tarfile.TarInfo, bytes | None]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz", format=tarfile.PAX_FORMAT) as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return buffer.getvalue()


def member(
    name: str,
    data: bytes = b"x",
    kind: bytes = tarfile.REGTYPE,
    link: str = "",
) -> tuple[tarfile.TarInfo, bytes | None]:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = link
    if kind in (tarfile.REGTYPE, tarfile.AREGTYPE):
        info.size = len(data)
        return info, data
    return info, None


def unpack(data: bytes, tmp_path: Path, limits: ArchiveLimits = LIMITS) -> Path:
    source = tmp_path / "upload"
    source.write_bytes(data)
    dest = tmp_path / "out"
    dest.mkdir()
    unpack_archive(source, dest, limits)
    return dest


def test_it_unpacks_regular_files_and_folders(tmp_path: Path) -> None:
    folder = tarfile.TarInfo("b")
    folder.type = tarfile.DIRTYPE
    archive = tar_gz((folder, None), member("b/meta.yaml", b"a: 1\n"), member("./b/t/x.csv", b"1"))
    out = unpack(archive, tmp_path)
    assert (out / "b" / "meta.yaml").read_bytes() == b"a: 1\n"
    assert (out / "b" / "t" / "x.csv").read_bytes() == b"1"
    assert find_bundle_root(out) == out / "b"


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        (member("/etc/passwd"), "absolute paths"),
        (member("../escape"), "'..'"),
        (member("a/../../escape"), "'..'"),
        (member("a\\..\\x"), "backslashes"),
        (member("C:/x"), "absolute paths"),
        (member("a/\x01b"), "control characters"),
        (member("link", kind=tarfile.SYMTYPE, link="/etc/passwd"), "symbolic links"),
        (member("hard", kind=tarfile.LNKTYPE, link="meta.yaml"), "hard links"),
        (member("dev", kind=tarfile.CHRTYPE), "device files"),
        (member("blk", kind=tarfile.BLKTYPE), "device files"),
        (member("fifo", kind=tarfile.FIFOTYPE), "FIFOs"),
        (member("cont", kind=tarfile.CONTTYPE), "not allowed"),
    ],
)
def test_it_refuses_dangerous_tar_entries(
    tmp_path: Path,
    entry: tuple[tarfile.TarInfo, bytes | None],
    message: str,
) -> None:
    with pytest.raises(ArchiveError, match=message):
        unpack(tar_gz(member("meta.yaml"), entry), tmp_path)
    assert not (tmp_path / "escape").exists()


def test_it_refuses_a_file_given_twice(tmp_path: Path) -> None:
    with pytest.raises(ArchiveError, match="appears twice"):
        unpack(tar_gz(member("a", b"1"), member("./a", b"2")), tmp_path)


def test_it_refuses_too_many_files(tmp_path: Path) -> None:
    members = [member(f"f{i}") for i in range(LIMITS.max_files + 1)]
    with pytest.raises(ArchiveError, match="more than 20 files"):
        unpack(tar_gz(*members), tmp_path)


def test_it_refuses_more_bytes_than_the_limit(tmp_path: Path) -> None:
    # 64 KiB of zeros compress to almost nothing: the limit is on what comes out.
    with pytest.raises(ArchiveError, match="more than 65536 bytes"):
        unpack(tar_gz(member("a", bytes(40_000)), member("b", bytes(40_000))), tmp_path)


def test_it_caps_decompressed_bytes_even_in_headers(tmp_path: Path) -> None:
    # A 4 MiB PAX header is no file size the budget sees; the decompression cap stops it.
    info, data = member("meta.yaml")
    info.pax_headers = {"comment": "x" * (4 << 20)}
    with pytest.raises(ArchiveError, match="more bytes than the registry accepts"):
        unpack(tar_gz((info, data)), tmp_path)


def test_it_refuses_an_archive_over_the_size_limit(tmp_path: Path) -> None:
    limits = ArchiveLimits(max_archive_bytes=10, max_unpacked_bytes=1 << 16, max_files=5)
    with pytest.raises(ArchiveError, match="the limit is 10"):
        unpack(tar_gz(member("a")), tmp_path, limits)


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"plain text",
        b"\x1f\x8bnot gzip at all",
        gzip.compress(b"not a tar"),
        b"PK\x03\x04junk",
    ],
)
def test_it_explains_what_is_not_an_archive(tmp_path: Path, data: bytes) -> None:
    with pytest.raises(ArchiveError):
        unpack(data, tmp_path)


def test_it_refuses_a_truncated_member(tmp_path: Path) -> None:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        info, data = member("meta.yaml", b"y" * 3000)
        tar.addfile(info, io.BytesIO(data))
    with pytest.raises(ArchiveError, match=r"damaged|truncated"):
        unpack(gzip.compress(raw.getvalue()[:2048]), tmp_path)


def zip_of(build: Callable[[zipfile.ZipFile], None]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as zf:
        build(zf)
    return buffer.getvalue()


def test_it_unpacks_zip_files(tmp_path: Path) -> None:
    def build(zf: zipfile.ZipFile) -> None:
        zf.writestr("x/meta.yaml", "a: 1")
        zf.writestr("x/t/", "")

    out = unpack(zip_of(build), tmp_path)
    assert (out / "x" / "meta.yaml").read_text() == "a: 1"


@pytest.mark.parametrize(
    ("name", "mode", "message"),
    [
        ("../up", stat.S_IFREG | 0o644, "'..'"),
        ("/abs", stat.S_IFREG | 0o644, "absolute"),
        ("link", stat.S_IFLNK | 0o777, "symbolic links"),
        ("fifo", stat.S_IFIFO | 0o644, "only regular files"),
    ],
)
def test_it_refuses_dangerous_zip_entries(
    tmp_path: Path,
    name: str,
    mode: int,
    message: str,
) -> None:
    def build(zf: zipfile.ZipFile) -> None:
        info = zipfile.ZipInfo(name)
        info.external_attr = mode << 16
        zf.writestr(info, "/etc/passwd")

    with pytest.raises(ArchiveError, match=message):
        unpack(zip_of(build), tmp_path)


def test_it_refuses_a_zip_declaring_more_than_the_limit(tmp_path: Path) -> None:
    def build(zf: zipfile.ZipFile) -> None:
        zf.writestr("big", bytes(70_000), compress_type=zipfile.ZIP_DEFLATED)

    with pytest.raises(ArchiveError, match="more than 65536 bytes"):
        unpack(zip_of(build), tmp_path)


def test_it_finds_the_bundle_root_only_down_single_folders(tmp_path: Path) -> None:
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "a" / "b" / "meta.yaml").write_text("x")
    assert find_bundle_root(tmp_path) == tmp_path / "a" / "b"
    (tmp_path / "a" / "stray.txt").write_text("outside the bundle")
    with pytest.raises(ArchiveError, match=r"no meta\.yaml"):
        find_bundle_root(tmp_path)


def test_it_writes_the_same_tar_gz_bytes_for_the_same_content() -> None:
    files = [
        ("meta.yaml", 3, lambda: io.BytesIO(b"a:1")),
        ("t/x.csv", 2, lambda: io.BytesIO(b"\r\n")),
    ]
    first = b"".join(iter_tar_gz("stem", files))
    assert first == b"".join(iter_tar_gz("stem", files))
    with tarfile.open(fileobj=io.BytesIO(first), mode="r:gz") as tar:
        assert [(m.name, m.size, m.mtime, m.uid) for m in tar.getmembers()] == [
            ("stem/meta.yaml", 3, 0, 0),
            ("stem/t/x.csv", 2, 0, 0),
        ]
        extracted = tar.extractfile("stem/t/x.csv")
        assert extracted is not None and extracted.read() == b"\r\n"


def test_it_notices_a_blob_shorter_than_its_manifest() -> None:
    with pytest.raises(OSError, match="manifest says 10"):
        b"".join(iter_tar_gz("s", [("a", 10, lambda: io.BytesIO(b"short"))]))
