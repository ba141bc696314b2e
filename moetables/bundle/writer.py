"""Writing the current layout: deterministic bytes, checksums filled in, atomic replacement.

The whole variant folder is staged beside its destination and swapped in by rename, so a
reader never sees a half-written bundle and a crash leaves either the old or the new one.
"""

from __future__ import annotations

import contextlib
import copy
import fcntl
import hashlib
import json
import logging
import math
import os
import re
import shutil
import tempfile
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from moetables.bundle.loads import (
    LOAD_SPREAD_FILE,
    LoadSpreadRow,
    format_load_spread,
    load_spread_evidence,
    tile_model_record,
    tile_models_record,
)
from moetables.bundle.model import (
    BLOCK_MODELS_FORMAT_VERSION,
    COLUMNS,
    COMPONENTS,
    CURRENT_FORMAT_VERSION,
    CURRENT_SCHEMA,
    LOADS_FORMAT_VERSION,
    SUPPLEMENT_FIELDS,
    SUPPLEMENT_KEY,
    WAVE_MODEL_SCHEMA,
    WAVE_MODELS_FORMAT_VERSION,
)
from moetables.bundle.quality import (
    CONSERVATION_FILE,
    STABILITY_FILE,
    ConservationRow,
    StabilityRow,
    format_conservation,
    format_stability,
    load_quality,
)
from moetables.bundle.reader import META, open_bundle, read_meta
from moetables.bundle.table import load_table
from moetables.errors import BundleError
from moetables.geometry import MoeTarget

__all__ = [
    "Row",
    "TableSpec",
    "attach_conservation",
    "attach_tile_models",
    "format_table",
    "recover_interrupted_write",
    "write_bundle",
]

Row = tuple[str, str, int, int, int, float]
_log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class TableSpec:
    """One deployment rank's measured rows with the contract and coverage that describe them.

    ``coverage`` is completed by the writer with ``table_sha256``. With ``stability`` the
    entry carries quality evidence (format 2): the stability controls and either the traced
    forwards' ``conservation`` rows or ``conservation_absent``, the reason there are none.
    """

    target: MoeTarget
    contract: Mapping[str, Any]
    coverage: Mapping[str, Any]
    rows: Sequence[Row]
    stability: Sequence[StabilityRow] | None = None
    conservation: Sequence[ConservationRow] | None = None
    conservation_absent: str | None = None

    @property
    def table(self) -> str:
        """TP-relative path of the table."""
        return f"moe_components/{self.target.deployment}/components.csv"


def _row_order(row: Row) -> tuple[int, str, int, int, int]:
    component, mode, tokens, active, pairs, _ = row
    rank = COMPONENTS.index(component) if component in COMPONENTS else len(COMPONENTS)
    return (rank, mode, tokens, active, pairs)


def format_table(rows: Iterable[Row]) -> bytes:
    """CSV bytes in a canonical order; times keep Python's shortest round-trip repr."""
    lines = [",".join(COLUMNS)]
    for component, mode, tokens, active, pairs, time_us in sorted(rows, key=_row_order):
        if not math.isfinite(time_us) or time_us <= 0:
            raise ValueError(f"time_us must be finite and positive, got {time_us!r}")
        lines.append(
            f"{component},{mode},{int(tokens)},{int(active)},{int(pairs)},{float(time_us)!r}"
        )
    return ("\n".join(lines) + "\n").encode()


def _dump_yaml(data: Mapping[str, Any]) -> bytes:
    return yaml.safe_dump(dict(data), sort_keys=False, default_flow_style=False, width=100).encode()


@contextlib.contextmanager
def _meta_lock(dest: Path) -> Iterator[None]:
    """Distinct targets writing into one variant serialize their root metadata updates."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    lock_path = dest.parent / f".{dest.name}.meta.lock"
    with lock_path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _stage(dest: Path) -> Path:
    """A fresh staging folder beside ``dest``, after repairing what a stopped write left
    (the caller holds the root's lock, so no other writer is at work)."""
    for line in recover_interrupted_write(dest):
        _log.warning("%s", line)
    return Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))


def recover_interrupted_write(dest: str | Path) -> list[str]:
    """Repair what a write of ``dest`` stopped by a kill left beside it; one line per repair.

    A write stages the new bundle in ``.NAME.<8 random characters>``, moves the old one aside to
    ``.NAME.old-PID``, moves the stage in and deletes the old one. A kill between the two moves
    leaves no ``NAME`` at all: the old bundle is moved back (the stage may be incomplete, and
    what it held is still in its writer's checkpoint). Leftover stages and old copies are
    deleted. Call it holding the root's lock (the writers here do); it changes nothing when
    nothing was left."""
    dest = Path(dest)
    if not dest.parent.is_dir():
        return []
    name = re.escape(dest.name)
    stage_name = re.compile(rf"\.{name}\.[a-z0-9_]{{8}}")
    retired_name = re.compile(rf"\.{name}\.old-\d+")
    stages, retired = [], []
    for path in dest.parent.iterdir():
        if not path.is_dir() or path.is_symlink():
            continue
        if stage_name.fullmatch(path.name):
            stages.append(path)
        elif retired_name.fullmatch(path.name):
            retired.append(path)
    lines = []
    if not dest.exists() and retired:
        retired.sort(key=lambda p: p.stat().st_mtime)
        newest = retired.pop()
        newest.rename(dest)
        lines.append(
            f"restored {dest} from {newest.name}: an earlier write was stopped between moving "
            "the old bundle aside and moving the new one in"
        )
    for path in sorted(stages + retired):
        shutil.rmtree(path, ignore_errors=True)
        lines.append(f"removed {path.name} beside {dest.name}, left by a write that was stopped")
    return lines


def write_bundle(
    dest: str | Path,
    header: Mapping[str, Any],
    tables: Sequence[TableSpec],
    *,
    merge: bool = True,
) -> Path:
    """Write ``tables`` into the current-layout bundle at ``dest``.

    ``header`` holds the root fields (hardware, model, variant, versions...). With ``merge``,
    entries of other targets already at ``dest`` are kept (and any other files beside them,
    such as an acquisition's samples.jsonl); a target written again replaces its entry. The
    result is validated before it replaces the old bundle.
    """
    dest = Path(dest)
    if not tables:
        raise ValueError("write_bundle needs at least one table")
    keys = [spec.target.key for spec in tables]
    if len(set(keys)) != len(keys):
        raise ValueError("two tables for the same deployment target")
    for required in ("hardware", "model", "variant"):
        if not isinstance(header.get(required), str) or not header[required]:
            raise ValueError(f"header.{required} must be a non-empty string")
    with _meta_lock(dest):
        stage = _stage(dest)
        try:
            meta: dict[str, Any] = {}
            if merge and dest.exists():
                shutil.copytree(dest, stage, dirs_exist_ok=True, copy_function=_link_or_copy)
                meta = read_meta(stage)
                if meta.get("moe_components") is not None:
                    raise BundleError(
                        META, "holds a historical index; write new measurements to another root"
                    )
            for key, value in header.items():
                if key != "per_tp":
                    meta[key] = copy.deepcopy(value)
            per_tp: dict[int, Any] = {int(k): v for k, v in (meta.get("per_tp") or {}).items()}
            for spec in tables:
                data = format_table(spec.rows)
                path = stage / f"tp{spec.target.tp}" / spec.table
                _write_fresh(path, data)
                coverage = dict(copy.deepcopy(spec.coverage))
                coverage["table_sha256"] = hashlib.sha256(data).hexdigest()
                entry = {
                    "target": spec.target.as_dict(),
                    "table": spec.table,
                    "contract": copy.deepcopy(dict(spec.contract)),
                    "coverage": coverage,
                }
                if spec.stability is not None:
                    entry["quality"] = _write_quality(stage, spec)
                owner = per_tp.setdefault(spec.target.tp, {}).setdefault(
                    "moe_components", {"schema": CURRENT_SCHEMA, "entries": []}
                )
                owner["entries"] = [
                    e
                    for e in owner["entries"]
                    if MoeTarget.from_dict(e["target"]).key != spec.target.key
                ] + [entry]
                owner["entries"].sort(key=lambda e: MoeTarget.from_dict(e["target"]).key)
            for tp, record in per_tp.items():
                owner = record.get("moe_components") if isinstance(record, dict) else None
                if isinstance(owner, dict) and owner.get("entries"):
                    owner.update(_format_of(tp, owner))
            meta["tp_degrees"] = sorted(per_tp)
            meta["per_tp"] = {tp: per_tp[tp] for tp in sorted(per_tp)}
            _write_fresh(stage / META, _dump_yaml(meta))
            bundle = open_bundle(stage)
            for written in bundle.entries:
                load_quality(stage, written, load_table(stage, written))
                load_spread_evidence(stage, written)
            _swap_in(stage, dest)
        except BaseException:
            shutil.rmtree(stage, ignore_errors=True)
            raise
    return dest


def _write_quality(stage: Path, spec: TableSpec) -> dict[str, Any]:
    """Write the stability and conservation files beside the table; return their refs."""
    assert spec.stability is not None
    folder = spec.table.rsplit("/", 1)[0]
    refs: dict[str, Any] = {}
    data = format_stability(spec.stability)
    _write_fresh(stage / f"tp{spec.target.tp}" / folder / STABILITY_FILE, data)
    refs["stability"] = {
        "file": f"{folder}/{STABILITY_FILE}",
        "sha256": hashlib.sha256(data).hexdigest(),
    }
    if spec.conservation:
        data = format_conservation(spec.conservation)
        _write_fresh(stage / f"tp{spec.target.tp}" / folder / CONSERVATION_FILE, data)
        refs["conservation"] = {
            "file": f"{folder}/{CONSERVATION_FILE}",
            "sha256": hashlib.sha256(data).hexdigest(),
        }
    else:
        if not spec.conservation_absent:
            raise ValueError("a table with quality evidence needs conservation rows or a reason")
        refs["conservation"] = {"absent": spec.conservation_absent}
    return refs


def _format_of(tp: int, owner: dict[str, Any]) -> dict[str, Any]:
    """Format 2 when every entry of the TP carries quality evidence, else format 1; format 3
    when, besides, an entry records its expert loads (issue 18); format 4 when one records a
    cost per block size (``tile_models``); format 5 when one of those is a wave model."""
    with_quality = [e for e in owner["entries"] if "quality" in e]
    loads = any("expert_loads" in e for e in owner["entries"])
    per_block = any("tile_models" in (e.get("expert_loads") or {}) for e in owner["entries"])
    per_wave = any(
        isinstance(m, dict) and m.get("schema") == WAVE_MODEL_SCHEMA
        for e in owner["entries"]
        for m in ((e.get("expert_loads") or {}).get("tile_models") or [])
    )
    if not with_quality:
        if loads:
            raise BundleError(
                f"meta.yaml:per_tp.{tp}.moe_components",
                "expert_loads (format 3) needs every entry's quality evidence (format 2) first",
            )
        owner.pop("format_version", None)
        return {}
    if len(with_quality) != len(owner["entries"]):
        raise BundleError(
            f"meta.yaml:per_tp.{tp}.moe_components",
            "mixes entries with and without quality evidence; re-publish the older targets "
            "with their evidence or write into another root",
        )
    # schema first, then the version, then the entries: the order a reader expects.
    entries = owner.pop("entries")
    owner["format_version"] = (
        WAVE_MODELS_FORMAT_VERSION
        if per_wave
        else BLOCK_MODELS_FORMAT_VERSION
        if per_block
        else LOADS_FORMAT_VERSION
        if loads
        else CURRENT_FORMAT_VERSION
    )
    owner["entries"] = entries
    return {}


def attach_tile_models(
    dest: str | Path,
    models: Mapping[MoeTarget, Sequence[LoadSpreadRow]],
    *,
    block_m: int | None = None,
    blocks: Sequence[int] | None = None,
    waves: Mapping[int, tuple[int, int]] | None = None,
) -> Path:
    """Record, for each named target of the bundle at ``dest``, its row-tile model fitted on
    ``models[target]`` (issue 18, format 3): the evidence is written beside the target's table
    as ``load_spread.csv`` and the entry gets ``expert_loads`` (rows balanced, the fitted cost).
    Tables and quality evidence keep their bytes; the result is validated, then swapped in.

    ``block_m``: one cost, charged where vLLM's block is at least that many rows (format 3's
    ``tile_model``). ``blocks``: one cost per vLLM block size named, each fitted on the records
    of exactly that block and charged only there (format 4's ``tile_models``). One of the two.
    ``waves`` (with ``blocks``): {block_m: (programs_per_sm, sms)}, blocks charged per wave of
    the kernel's grid instead of per tile (format 5, `moetables.waves`)."""
    if (block_m is None) == (blocks is None):
        raise ValueError("give block_m (one cost) or blocks (one cost per block size), not both")
    if blocks is not None and (not blocks or any(int(b) < 1 for b in blocks)):
        raise ValueError(f"blocks must name block sizes >= 1, got {blocks!r}")
    dest = Path(dest)
    with _meta_lock(dest):
        stage = _stage(dest)
        try:
            shutil.copytree(dest, stage, dirs_exist_ok=True, copy_function=_link_or_copy)
            meta = read_meta(stage)
            per_tp = meta.get("per_tp") or {}
            wanted = {t.key: rows for t, rows in models.items()}
            for tp, record in per_tp.items():
                owner = record.get("moe_components") if isinstance(record, dict) else None
                if not isinstance(owner, dict):
                    continue
                for entry in owner.get("entries", []):
                    key = MoeTarget.from_dict(entry["target"]).key
                    rows = wanted.pop(key, None)
                    if rows is None:
                        continue
                    folder = str(entry["table"]).rsplit("/", 1)[0]
                    data = format_load_spread(rows)
                    _write_fresh(stage / f"tp{tp}" / folder / LOAD_SPREAD_FILE, data)
                    evidence = {
                        "file": f"{folder}/{LOAD_SPREAD_FILE}",
                        "sha256": hashlib.sha256(data).hexdigest(),
                    }
                    entry["expert_loads"] = (
                        tile_model_record(rows, block_m=block_m, evidence=evidence)
                        if block_m is not None
                        else tile_models_record(
                            rows,
                            blocks=blocks or (),
                            evidence=evidence,
                            waves=waves,
                            contract=entry.get("contract"),
                            local_experts=int(entry["contract"]["local_experts"]),
                        )
                    )
                owner.update(_format_of(int(tp), owner))
            if wanted:
                raise ValueError(f"the bundle has no entries for targets {sorted(wanted)}")
            _write_fresh(stage / META, _dump_yaml(meta))
            bundle = open_bundle(stage)
            for written in bundle.entries:
                load_quality(stage, written, load_table(stage, written))
                load_spread_evidence(stage, written)
            _swap_in(stage, dest)
        except BaseException:
            shutil.rmtree(stage, ignore_errors=True)
            raise
    return dest


def attach_conservation(
    source: str | Path,
    traced: Mapping[MoeTarget, tuple[Sequence[ConservationRow], Mapping[str, Any]]],
    *,
    dest: str | Path | None = None,
    replace: bool = False,
    note: Mapping[str, Any] | None = None,
) -> Path:
    """Add conservation traces measured separately from the tables (supplementary evidence).

    ``traced[target]`` holds the target's rows and what its contract will say of them under
    ``supplementary_conservation`` (SUPPLEMENT_FIELDS at least). Each named entry must carry
    quality evidence (format 2 or 3) without conservation rows; rows that are themselves
    supplementary are replaced only with ``replace``, and rows measured with the table never.
    The file is marked ``supplementary: true`` beside its digest. Tables, stability files and
    load evidence keep their bytes (checked). The bundle at ``source`` is staged, changed,
    validated and swapped in at ``dest`` (default: ``source``; another ``dest`` must not exist
    yet), so a failure leaves nothing half-written. ``note`` goes to the root metadata.
    """
    source = Path(source)
    dest = Path(dest) if dest is not None else source
    if dest != source and dest.exists():
        raise BundleError(str(dest), "already exists; write the updated bundle elsewhere")
    with _meta_lock(dest):
        stage = _stage(dest)
        try:
            shutil.copytree(source, stage, dirs_exist_ok=True, copy_function=_link_or_copy)
            before = _kept_digests(stage)
            meta = read_meta(stage)
            wanted = {t.key: value for t, value in traced.items()}
            for tp, record in (meta.get("per_tp") or {}).items():
                owner = record.get("moe_components") if isinstance(record, dict) else None
                if not isinstance(owner, dict):
                    continue
                for entry in owner.get("entries", []):
                    key = MoeTarget.from_dict(entry["target"]).key
                    if key not in wanted:
                        continue
                    rows, supplement = wanted.pop(key)
                    where = f"{entry['table']} [{key}]"
                    _check_attachable(entry, where, replace=replace)
                    for field_name in SUPPLEMENT_FIELDS:
                        if not isinstance(supplement.get(field_name), str):
                            raise ValueError(f"{where}: the supplement needs {field_name}")
                    if not rows:
                        raise ValueError(f"{where}: no traced forward to attach")
                    folder = str(entry["table"]).rsplit("/", 1)[0]
                    data = format_conservation(rows)
                    _write_fresh(stage / f"tp{tp}" / folder / CONSERVATION_FILE, data)
                    entry["quality"]["conservation"] = {
                        "file": f"{folder}/{CONSERVATION_FILE}",
                        "sha256": hashlib.sha256(data).hexdigest(),
                        "supplementary": True,
                    }
                    entry["contract"][SUPPLEMENT_KEY] = json.loads(
                        json.dumps(dict(supplement), allow_nan=False)
                    )
            if wanted:
                raise ValueError(f"the bundle has no entries for targets {sorted(wanted)}")
            if note is not None:
                meta[SUPPLEMENT_KEY] = copy.deepcopy(dict(note))
            _write_fresh(stage / META, _dump_yaml(meta))
            bundle = open_bundle(stage)
            for written in bundle.entries:
                load_quality(stage, written, load_table(stage, written))
                load_spread_evidence(stage, written)
            after = _kept_digests(stage)
            if after != before:
                raise BundleError(str(source), f"kept files changed: {before} -> {after}")
            if dest == source:
                _swap_in(stage, dest)
            else:
                stage.chmod(0o755)
                stage.rename(dest)
        except BaseException:
            shutil.rmtree(stage, ignore_errors=True)
            raise
    return dest


def _check_attachable(entry: Mapping[str, Any], where: str, *, replace: bool) -> None:
    quality = entry.get("quality")
    if not isinstance(quality, dict):
        raise BundleError(
            where,
            "carries no quality evidence (format 1): re-publish its stability evidence first "
            "(python -m acquisition.evidence BUNDLE SAMPLES.tar.gz)",
        )
    existing = quality.get("conservation")
    if isinstance(existing, dict) and "file" in existing:
        if not existing.get("supplementary"):
            raise BundleError(
                where,
                "already has conservation rows measured with its table; they are never replaced",
            )
        if not replace:
            raise BundleError(
                where, "already has supplementary conservation rows (replace them with --replace)"
            )


def _kept_digests(root: Path) -> dict[str, str]:
    """Digests of every file an attachment must keep: tables, stability and load evidence."""
    return {
        str(path.relative_to(root)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(root.rglob("*"))
        if path.is_file() and path.name != META and path.name != CONSERVATION_FILE
    }


def _write_fresh(path: Path, data: bytes) -> None:
    """Write a new inode: staged files may be hard links into the bundle being replaced."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    path.write_bytes(data)


def _link_or_copy(src: str, dst: str) -> object:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)
    return dst


def _swap_in(stage: Path, dest: Path) -> None:
    stage.chmod(0o755)
    if not dest.exists():
        stage.rename(dest)
        return
    retired = dest.parent / f".{dest.name}.old-{os.getpid()}"
    dest.rename(retired)
    try:
        stage.rename(dest)
    except BaseException:
        retired.rename(dest)
        raise
    shutil.rmtree(retired, ignore_errors=True)
