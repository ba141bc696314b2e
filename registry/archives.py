"""Archives in and out: safe unpacking of uploads, deterministic .tar.gz of a bundle.

Unpacking trusts nothing in the archive: names are checked before anything is written, only
regular files and folders are created (never links, devices or FIFOs), nothing is overwritten,
and the number of entries and the bytes decompressed are capped, so an archive cannot write
outside its folder or fill the disk.
"""

from __future__ import annotations

import gzip
import io
import os
import stat
import tarfile
import zipfile
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING, cast

from registry.manifest import ManifestError, check_member_path

if TYPE_CHECKING:
    from pathlib import Path

__all__ = ["ArchiveError", "ArchiveLimits", "find_bundle_root", "iter_tar_gz", "unpack_archive"]

GZIP_MAGIC = b"\x1f\x8b"
ZIP_MAGIC = b"PK\x03\x04"
BLOCK = tarfile.BLOCKSIZE
RECORD = tarfile.RECORDSIZE
# Errors the standard library raises on damaged archives; each becomes a clear ArchiveError.
_DAMAGED = (
    tarfile.TarError,
    zipfile.BadZipFile,
    zipfile.LargeZipFile,
    EOFError,
    zlib.error,
    gzip.BadGzipFile,
    NotImplementedError,
    RuntimeError,
    UnicodeError,
    ValueError,
    OverflowError,
)


class ArchiveError(ValueError):
    """The upload is not an archive this registry accepts; the message says why."""


@dataclass(frozen=True, slots=True)
class ArchiveLimits:
    max_archive_bytes: int
    max_unpacked_bytes: int
    max_files: int

    @property
    def max_entries(self) -> int:
        # Folders are entries too; a bundle has far fewer folders than files.
        return 2 * self.max_files + 16


class _CappedReader(io.RawIOBase):
    """Reads a decompressing stream and fails once more than ``cap`` bytes came out of it."""

    def __init__(self, inner: IO[bytes], cap: int) -> None:
        self._inner = inner
        self._left = cap

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        data = self._inner.read(len(buffer))
        self._left -= len(data)
        if self._left < 0:
            raise ArchiveError("the archive unpacks to more bytes than the registry accepts")
        buffer[: len(data)] = data
        return len(data)


def _sniff(source: Path) -> str:
    with source.open("rb") as handle:
        head = handle.read(4)
    if head.startswith(GZIP_MAGIC):
        return "tar.gz"
    if head == ZIP_MAGIC:
        return "zip"
    raise ArchiveError("not a .tar.gz or .zip archive (unrecognized leading bytes)")


def unpack_archive(source: Path, dest: Path, limits: ArchiveLimits) -> None:
    """Unpack ``source`` (.tar.gz or .zip, recognized by content) into the empty folder ``dest``."""
    size = source.stat().st_size
    if size > limits.max_archive_bytes:
        raise ArchiveError(f"the archive is {size} bytes; the limit is {limits.max_archive_bytes}")
    kind = _sniff(source)
    try:
        if kind == "zip":
            _unpack_zip(source, dest, limits)
        else:
            _unpack_tar_gz(source, dest, limits)
    except ArchiveError:
        raise
    except ManifestError as exc:
        raise ArchiveError(str(exc)) from None
    except _DAMAGED as exc:
        raise ArchiveError(f"the {kind} archive is damaged or unsupported ({exc})") from None
    except OSError as exc:
        reason = exc.strerror or exc
        raise ArchiveError(f"the {kind} archive cannot be unpacked ({reason})") from None


class _Budget:
    def __init__(self, limits: ArchiveLimits) -> None:
        self.limits = limits
        self.entries = 0
        self.files = 0
        self.bytes = 0
        self.seen: set[str] = set()

    def entry(self, name: str) -> str:
        self.entries += 1
        if self.entries > self.limits.max_entries:
            raise ArchiveError(f"the archive has more than {self.limits.max_entries} entries")
        return check_member_path(name)

    def file(self, path: str, size: int) -> None:
        if path in self.seen:
            raise ArchiveError(f"{path!r} appears twice in the archive")
        self.seen.add(path)
        self.files += 1
        if self.files > self.limits.max_files:
            raise ArchiveError(f"the archive has more than {self.limits.max_files} files")
        if size < 0:
            raise ArchiveError(f"{path!r} declares a negative size")
        self.bytes += size
        if self.bytes > self.limits.max_unpacked_bytes:
            raise ArchiveError(
                f"the archive unpacks to more than {self.limits.max_unpacked_bytes} bytes"
            )


def _write_member(dest: Path, path: str, reader: IO[bytes], size: int) -> None:
    target = dest.joinpath(*path.split("/"))
    target.parent.mkdir(parents=True, exist_ok=True)
    # O_EXCL: an entry never replaces another; O_NOFOLLOW: never write through a link.
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    fd = os.open(target, flags, 0o644)
    written = 0
    with os.fdopen(fd, "wb") as out:
        while block := reader.read(1 << 20):
            written += len(block)
            if written > size:
                raise ArchiveError(f"{path!r} holds more bytes than its header declares")
            out.write(block)
    if written != size:
        raise ArchiveError(f"{path!r} is truncated: {written} of {size} bytes")


class _StrictTarInfo(tarfile.TarInfo):
    """A header that tarfile cannot read is an error, not the end of the archive.

    tarfile stops quietly at a damaged header after the first member, so a bundle cut by a
    bad block kept only the members before it and was accepted (issue 17, item 5). The end
    marker (a zero block) is remembered, so that what follows it can be checked.
    """

    @classmethod
    def fromtarfile(cls, archive: tarfile.TarFile) -> _StrictTarInfo:
        try:
            return super().fromtarfile(archive)
        except tarfile.EOFHeaderError:  # type: ignore[attr-defined]  # private, stable since 3.2
            archive.saw_end_marker = True  # type: ignore[attr-defined]
            raise
        except tarfile.EmptyHeaderError:  # type: ignore[attr-defined]
            raise  # the data ends at a block boundary: the end, with no marker
        except (tarfile.InvalidHeaderError, tarfile.TruncatedHeaderError) as exc:  # type: ignore[attr-defined]
            raise ArchiveError(
                f"a damaged tar header at byte {archive.offset} of the tar stream ({exc})"
            ) from None
        except UnicodeDecodeError as exc:
            raise ArchiveError(
                f"a member name near byte {archive.offset} is not UTF-8 ({exc.reason})"
            ) from None


def _rest_is_zeros(tar: tarfile.TarFile, stream: IO[bytes]) -> bool:
    """Whether everything after the end marker is zero padding (tar pads to a record)."""
    leftover = getattr(tar.fileobj, "buf", b"")
    if leftover.strip(b"\0"):
        return False
    while block := stream.read(1 << 16):
        if block.strip(b"\0"):
            return False
    return True


def _unpack_tar_gz(source: Path, dest: Path, limits: ArchiveLimits) -> None:
    budget = _Budget(limits)
    # Headers count against the cap too: BLOCK per entry plus PAX records.
    cap = limits.max_unpacked_bytes + (limits.max_entries + 4) * 2 * BLOCK + RECORD
    with gzip.open(source, "rb") as raw:
        stream = io.BufferedReader(_CappedReader(cast("IO[bytes]", raw), cap), buffer_size=1 << 16)
        with tarfile.open(
            fileobj=stream,
            mode="r|",
            tarinfo=_StrictTarInfo,
            encoding="utf-8",
            errors="strict",
        ) as tar:
            for member in tar:
                path = budget.entry(member.name)
                if member.isdir():
                    continue
                if member.type not in (tarfile.REGTYPE, tarfile.AREGTYPE):
                    raise ArchiveError(f"{path!r}: {_tar_kind(member)} are not allowed in a bundle")
                budget.file(path, member.size)
                reader = tar.extractfile(member)
                if reader is None:  # pragma: no cover - regular members always have data
                    raise ArchiveError(f"{path!r} has no data")
                _write_member(dest, path, reader, member.size)
            if getattr(tar, "saw_end_marker", False) and not _rest_is_zeros(tar, stream):
                raise ArchiveError("the archive has data after the tar end marker")
    if budget.files == 0:
        raise ArchiveError("the archive holds no files")


def _tar_kind(member: tarfile.TarInfo) -> str:
    if member.issym():
        return "symbolic links"
    if member.islnk():
        return "hard links"
    if member.ischr() or member.isblk():
        return "device files"
    if member.isfifo():
        return "FIFOs"
    return f"entries of type {member.type!r}"


def _unpack_zip(source: Path, dest: Path, limits: ArchiveLimits) -> None:
    budget = _Budget(limits)
    with zipfile.ZipFile(source) as archive:
        infos = archive.infolist()
        if len(infos) > limits.max_entries:
            raise ArchiveError(f"the archive has more than {limits.max_entries} entries")
        for info in infos:
            path = budget.entry(_zip_name(info))
            mode = info.external_attr >> 16
            kind = stat.S_IFMT(mode)
            if info.is_dir():
                if kind and kind != stat.S_IFDIR:
                    raise ArchiveError(f"{path!r}: only regular files and folders are allowed")
                continue
            if stat.S_ISLNK(mode):
                raise ArchiveError(f"{path!r}: symbolic links are not allowed in a bundle")
            if kind and kind != stat.S_IFREG:
                raise ArchiveError(f"{path!r}: only regular files are allowed in a bundle")
            if info.flag_bits & 0x1:
                raise ArchiveError(f"{path!r} is encrypted")
            budget.file(path, info.file_size)
            with archive.open(info) as reader:
                _write_member(dest, path, reader, info.file_size)
    if budget.files == 0:
        raise ArchiveError("the archive holds no files")


def _zip_name(info: zipfile.ZipInfo) -> str:
    """The member name as UTF-8, strictly: zipfile reads names without the UTF-8 flag as
    cp437, which turns any bytes into some text; those bytes must be UTF-8 too."""
    if info.flag_bits & 0x800:
        return info.filename  # zipfile decoded it as UTF-8 (strictly)
    try:
        return info.orig_filename.encode("cp437").decode("utf-8")
    except UnicodeError:
        raise ArchiveError(f"the member name {info.orig_filename!r} is not UTF-8") from None


def find_bundle_root(folder: Path, marker: str = "meta.yaml") -> Path:
    """The folder holding ``marker``: ``folder`` itself or down a chain of single subfolders.

    Archives usually wrap a bundle in one folder (``name/meta.yaml``); anything beside that
    chain would be a file outside the bundle, so a branching tree without the marker at its
    top is refused.
    """
    current = folder
    for _ in range(64):
        if (current / marker).is_file():
            return current
        children = list(current.iterdir())
        if len(children) != 1 or not children[0].is_dir() or children[0].is_symlink():
            break
        current = children[0]
    raise ArchiveError(
        f"no {marker} at the top of the archive (or inside a single top-level folder)"
    )


class _Sink(io.RawIOBase):
    def __init__(self) -> None:
        self._chunks: list[bytes] = []

    def writable(self) -> bool:
        return True

    def write(self, data: bytes | bytearray | memoryview) -> int:  # type: ignore[override]
        self._chunks.append(bytes(data))
        return len(data)

    def take(self) -> bytes:
        data = b"".join(self._chunks)
        self._chunks.clear()
        return data


Opener = Callable[[], IO[bytes]]


def iter_tar_gz(prefix: str, files: Iterable[tuple[str, int, Opener]]) -> Iterator[bytes]:
    """Yield a .tar.gz of ``files`` (path, size, opener) under the folder ``prefix``.

    The bytes depend only on the prefix, paths and contents: mtime 0, owner root, mode 0644,
    gzip header without name or time. Each file is streamed in 1 MiB blocks.
    """
    sink = _Sink()
    gz = gzip.GzipFile(filename="", mode="wb", fileobj=sink, mtime=0, compresslevel=6)
    written = 0
    for path, size, opener in files:
        info = tarfile.TarInfo(f"{prefix}/{path}")
        info.size = size
        info.mtime = 0
        info.mode = 0o644
        info.uid = info.gid = 0
        info.uname = info.gname = ""
        header = info.tobuf(format=tarfile.PAX_FORMAT, encoding="utf-8", errors="strict")
        gz.write(header)
        written += len(header)
        copied = 0
        with opener() as handle:
            while block := handle.read(1 << 20):
                copied += len(block)
                gz.write(block)
                yield sink.take()
        if copied != size:
            raise OSError(f"{path}: stored blob has {copied} bytes, the manifest says {size}")
        padding = -size % BLOCK
        gz.write(b"\0" * padding)
        written += size + padding
    end = 2 * BLOCK
    end += -(written + end) % RECORD
    gz.write(b"\0" * end)
    gz.close()
    yield sink.take()
