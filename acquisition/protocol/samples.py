"""The acquisition checkpoint: samples.jsonl, its writer lock and the failure log (R36, R37).

Every forward and control is appended as one JSON line as soon as it is known; a rerun of the
same command reads the file back and skips finished work. A trailing line cut short by a kill
is archived beside the file before repair; a malformed complete line stops the resume rather
than being guessed at. Each run appends a ``session`` record with the resume identity (the
immutable semantic conditions) and its observations (versions, host, command line), and the
identity must match every earlier session's: a changed condition needs another --out-root.

Record types (all carry ``type`` and ``session``):

- ``session``: ``identity``, ``observations``
- ``forward``: ``point``, ``attempt``, ``arm`` (local, B or 2B), ``round``, ``index``, ``time_us``
- ``context``: closes one context: ``point``, ``attempt``, ``arm``, ``round``, ``forwards``,
  ``banks``; only closed contexts count on resume
- ``reference_check``: ``point``, ``slots`` compared exactly with the eager reference
- ``control``: ``point``, ``attempt``, ``selected_us``, ``control_us``, pooled medians,
  ``relative_change``, ``tolerance``, ``passed``, ``banks``
- ``point``: ``point``, ``attempt``, ``status`` (measured or failed), ``time_us``

``session``, ``context``, ``control`` and ``point`` records also carry ``at`` (Unix seconds).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
import uuid
from dataclasses import dataclass, field
from typing import IO, TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

__all__ = [
    "FAILURES",
    "LOCK",
    "SAMPLES",
    "AttemptState",
    "CheckpointError",
    "PointState",
    "SampleLog",
    "append_failure",
    "writer_lock",
]

SAMPLES = "samples.jsonl"
LOCK = "writer.lock"
FAILURES = "failures.jsonl"
_TYPES = {"session", "forward", "context", "reference_check", "control", "point"}
# Wall-clock seconds on these records give an audit trail and the run's points per minute.
_STAMPED = {"session", "context", "control", "point"}


class CheckpointError(RuntimeError):
    """samples.jsonl cannot be resumed (malformed, another contract, another writer)."""


@contextlib.contextmanager
def writer_lock(directory: Path) -> Iterator[None]:
    """Exclusive writer of one target's work directory; released by the OS on kill -9."""
    directory.mkdir(parents=True, exist_ok=True)
    with (directory / LOCK).open("a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise CheckpointError(
                f"another acquisition writes {directory} (its {LOCK} is held); run one writer "
                "per target"
            ) from None
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@dataclass(slots=True)
class AttemptState:
    contexts: dict[tuple[str, int], list[float]] = field(default_factory=dict)
    control: dict[str, Any] | None = None
    # The control record's position among the records read and written (its order in the
    # file): a resume queues retries in the order their controls failed.
    sequence: int = -1


@dataclass(slots=True)
class PointState:
    attempts: dict[int, AttemptState] = field(default_factory=dict)
    result: dict[str, Any] | None = None
    reference_checked: bool = False

    @property
    def measured(self) -> bool:
        return self.result is not None and self.result.get("status") == "measured"

    @property
    def time_us(self) -> float:
        if not self.measured or self.result is None:
            raise KeyError("point not measured")
        return float(self.result["time_us"])

    def open_attempt(self) -> tuple[int, AttemptState]:
        """The attempt to continue: the latest without a verdict, else a fresh one.

        A failed control is that attempt's verdict. A passed control whose ``point`` record
        a kill cut off is not: the attempt is continued, and its verdict is written from the
        control already recorded rather than the point measured again.
        """
        if self.attempts:
            latest = max(self.attempts)
            state = self.attempts[latest]
            decided = (state.control is not None and not state.control["passed"]) or (
                self.result is not None and self.result.get("attempt") == latest
            )
            if not decided:
                return latest, state
            return latest + 1, self.attempts.setdefault(latest + 1, AttemptState())
        return 0, self.attempts.setdefault(0, AttemptState())

    def control(self, attempt: int) -> dict[str, Any] | None:
        state = self.attempts.get(attempt)
        return state.control if state else None


def _plain(record: dict[str, Any]) -> bool:
    return all(type(v) in (str, int, float) for v in record.values())


def _archive_partial(path: Path) -> Path | None:
    """Move an incomplete trailing line aside and truncate the file to whole lines."""
    data = path.read_bytes()
    if not data or data.endswith(b"\n"):
        return None
    cut = data.rfind(b"\n") + 1
    number = 0
    while True:
        archive = path.with_name(f"{path.name}.incomplete-{number}")
        if not archive.exists():
            break
        number += 1
    archive.write_bytes(data[cut:])
    with path.open("r+b") as handle:
        handle.truncate(cut)
    return archive


class SampleLog:
    """samples.jsonl of one target, opened for appending by this run's session."""

    def __init__(self, path: Path, session: str, handle: IO[str]) -> None:
        self.path = path
        self.session = session
        self._handle = handle
        self.points: dict[str, PointState] = {}
        self.sessions: list[dict[str, Any]] = []
        self.productive_sessions: list[str] = []
        self.archived: Path | None = None
        self._pending: dict[tuple[Any, ...], list[float]] = {}
        self._sequence = 0

    @classmethod
    def open(
        cls, directory: Path, identity: dict[str, Any], observations: dict[str, Any]
    ) -> SampleLog:
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / SAMPLES
        archived = _archive_partial(path) if path.exists() else None
        session = uuid.uuid4().hex[:12]
        log = cls(path, session, path.open("a", encoding="utf-8"))
        log.archived = archived
        if path.stat().st_size:
            log._replay(identity)
        log.append({"type": "session", "identity": identity, "observations": observations})
        log.sync()
        return log

    @staticmethod
    def check_resumable(directory: Path, identity: dict[str, Any]) -> None:
        """Before a target is built (seconds to minutes of engine start): CheckpointError if
        the checkpoint's first session disagrees with ``identity`` on any field it names.

        ``identity`` may leave out what only the built session knows (the bank count); `open`
        checks the whole identity of every session afterwards. Reads up to the first session
        record, so a large checkpoint costs a line or two."""
        path = directory / SAMPLES
        if not path.is_file():
            return
        with path.open(encoding="utf-8") as handle:
            for line in handle:
                try:
                    record = json.loads(line)
                except json.JSONDecodeError:
                    return  # `open` names the malformed line
                if not isinstance(record, dict) or record.get("type") != "session":
                    continue
                old = record.get("identity") or {}
                known = {k: old.get(k) for k in identity}
                if known != identity:
                    raise _other_conditions(path, known, identity)
                return

    def _replay(self, identity: dict[str, Any]) -> None:
        with self.path.open(encoding="utf-8") as handle:
            for number, line in enumerate(handle, start=1):
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise CheckpointError(
                        f"{self.path}:{number}: malformed record ({exc.msg}); refusing to resume"
                    ) from None
                if not isinstance(record, dict) or record.get("type") not in _TYPES:
                    raise CheckpointError(
                        f"{self.path}:{number}: unknown record; refusing to resume"
                    )
                if record["type"] == "session" and record.get("identity") != identity:
                    raise _other_conditions(self.path, record.get("identity") or {}, identity)
                self._apply(record)

    def _apply(self, record: dict[str, Any]) -> None:
        kind = record["type"]
        self._sequence += 1
        if kind == "session":
            self.sessions.append(record)
            return
        state = self.points.setdefault(record["point"], PointState())
        if kind == "forward":
            key = (
                record["session"],
                record["point"],
                record["attempt"],
                record["arm"],
                record["round"],
            )
            self._pending.setdefault(key, []).append(float(record["time_us"]))
        elif kind == "context":
            key = (
                record["session"],
                record["point"],
                record["attempt"],
                record["arm"],
                record["round"],
            )
            times = self._pending.pop(key, [])
            if len(times) != record["forwards"]:
                raise CheckpointError(
                    f"{self.path}: context {key[1:]} closes {record['forwards']} forwards but "
                    f"{len(times)} were recorded"
                )
            attempt = state.attempts.setdefault(record["attempt"], AttemptState())
            attempt.contexts[(record["arm"], record["round"])] = times
        elif kind == "reference_check":
            state.reference_checked = True
        elif kind == "control":
            attempt = state.attempts.setdefault(record["attempt"], AttemptState())
            attempt.control = record
            attempt.sequence = self._sequence
        elif kind == "point":
            state.result = record
            if (
                record.get("status") == "measured"
                and record["session"] not in self.productive_sessions
            ):
                self.productive_sessions.append(record["session"])

    def append(self, record: dict[str, Any]) -> None:
        self.extend([record])

    def extend(self, records: list[dict[str, Any]]) -> None:
        """Append records in one write, so a kill leaves whole records or one cut line."""
        lines = []
        for record in records:
            full = {"type": record["type"], "session": self.session, **record}
            if full["type"] in _STAMPED:
                full.setdefault("at", round(time.time(), 3))
            line = json.dumps(full, sort_keys=True, allow_nan=False)
            lines.append(line)
            # Apply what a replay will read, so a resumed run sees the same values and order.
            # A forward holds only strings, ints and one finite float, which JSON gives back
            # unchanged (floats round-trip exactly): the parse is skipped for the bulk records.
            self._apply(full if full["type"] == "forward" and _plain(full) else json.loads(line))
        self._handle.write("\n".join(lines) + "\n")
        self._handle.flush()

    def sync(self) -> None:
        self._handle.flush()
        os.fsync(self._handle.fileno())

    def state(self, point: str) -> PointState:
        return self.points.setdefault(point, PointState())

    def observations(self, session: str) -> dict[str, Any]:
        for record in self.sessions:
            if record["session"] == session:
                return dict(record.get("observations") or {})
        return {}

    def close(self) -> None:
        self.sync()
        self._handle.close()


def append_failure(directory: Path, record: dict[str, Any]) -> None:
    """failures.jsonl: written on failure only, never part of a published bundle (R37)."""
    directory.mkdir(parents=True, exist_ok=True)
    with (directory / FAILURES).open("a", encoding="utf-8") as handle:
        handle.write(json.dumps(record, sort_keys=True, default=str) + "\n")


# What a changed hash stands for: the field itself cannot say which option moved it.
_HASHED = {
    "point_plan_sha256": "the point plan: grid factor, token and sequence limits, capture sizes, "
    "cudagraph mode or kernel-step rule",
}


def _other_conditions(path: Path, old: dict[str, Any], new: dict[str, Any]) -> CheckpointError:
    """The refusal of a resume whose identity changed, naming each changed field."""
    return CheckpointError(
        f"{path} was acquired under other semantic conditions "
        f"(changed: {', '.join(_identity_changes(old, new))}); resume only the same command, "
        "or choose another --out-root for a new measurement"
    )


def _identity_changes(old: dict[str, Any], new: dict[str, Any], prefix: str = "") -> list[str]:
    """Each changed field of a resume identity by its dotted name, with the checkpoint's value
    and this command's (``protocol.rounds (2 -> 3)``), so a refusal names the option."""
    out = []
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key), new.get(key)
        if a == b:
            continue
        name = prefix + str(key)
        if isinstance(a, dict) and isinstance(b, dict):
            out += _identity_changes(a, b, name + ".")
        elif key in _HASHED:
            out.append(f"{name} ({_HASHED[key]})")
        else:
            out.append(f"{name} ({_short(a)} -> {_short(b)})")
    return out


def _short(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, default=str)
    return text if len(text) <= 60 else text[:57] + "..."
