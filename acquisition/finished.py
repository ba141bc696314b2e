"""Which targets of a command are already published, so that a resume skips them (issue 19).

A rerun of the same command (after a target's points failed their B/2B control, a kill or a
time limit) used to rebuild every target: admission, the backend's construction and, with
``--isolate-targets``, a child process each, only to find nothing pending and publish the
same rows again (65 s of a 419.7 s H200 run, docs/benchmarks.md). A published target now
leaves ``published.json`` beside its checkpoint, and the next run of the same command skips
the target without importing torch when all of these still hold:

- the marker's *request key* equals this command's: the conditions of the target's resume
  identity that are known before admission (model and config hash, hardware, dtype, variant,
  target, requested backend, device, the requested point plan's hash, the protocol settings,
  a declared cache size, the engine options, and vLLM's FP8 switches for block-FP8 models);
- samples.jsonl is byte for byte the file the published table was computed from (size and
  SHA-256), so nothing was measured or resumed under it since;
- the bundle still holds the target's entry with the same table (its ``table_sha256``, and the
  file's bytes), the same published plan hash and backend.

Anything else (no marker, another condition, a changed checkpoint, a bundle entry removed or
replaced) falls back to the full path, which rebuilds, re-opens the checkpoint under its
identity check and publishes again: skipping is only ever an exact shortcut of a no-op resume.
What a skipped target would have published is what the bundle already holds: a no-op resume
adds no provenance (``acquisition.acquire``, ``productive_sessions``) and re-writes the same rows.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from acquisition.protocol.samples import SAMPLES
from moetables.bundle.reader import read_meta
from moetables.errors import BundleError

if TYPE_CHECKING:
    from collections.abc import Iterable
    from pathlib import Path

    from acquisition.plan import PointPlan
    from acquisition.request import AcquisitionRequest

__all__ = ["MARKER", "FinishedTarget", "finished_target", "request_key", "write_marker"]

MARKER = "published.json"
_SCHEMA = "moe-acquisition-published-v1"


@dataclass(frozen=True, slots=True)
class FinishedTarget:
    """A target a resume skips: its published point count and backend, for progress."""

    points: int
    backend: str
    plan_sha256: str


def request_key(request: AcquisitionRequest, plan: PointPlan) -> dict[str, Any]:
    """What must be unchanged for a published target to stand for this command's.

    ``plan`` is the plan before admission (an adapter may re-plan its components); the plan it
    published is checked against the bundle separately.
    """
    key: dict[str, Any] = {
        "model": request.model.name,
        "model_config_sha256": request.model.config_sha256,
        "hardware": request.hardware,
        "dtype": request.dtype,
        "variant": request.variant,
        "target": plan.target.as_dict(),
        "backend": request.backend,
        "device": request.device,
        "point_plan_sha256": plan.sha256,
        "protocol": request.settings.identity(),
        "cache_bytes": request.cache_bytes,
        "engine": {
            "max_num_batched_tokens": request.max_num_batched_tokens,
            "max_num_seqs": request.max_num_seqs,
            "attention_backend": request.engine_attention_backend,
            "kv_cache_memory_bytes": request.engine_kv_cache_bytes,
        },
    }
    if request.model.block_fp8:
        # The same switches the checkpoint identity carries (acquisition.acquire._identity).
        from acquisition.adapters.vllm_fp8 import oracle_environment

        key["vllm_fp8_environment"] = oracle_environment(os.environ)
    # Through JSON, so that the key compares equal to the one read back from the marker.
    loaded: dict[str, Any] = json.loads(json.dumps(key, sort_keys=True))
    return loaded


def _file_digest(path: Path) -> tuple[int, str] | None:
    try:
        with path.open("rb") as handle:
            digest = hashlib.file_digest(handle, "sha256")
            return handle.tell(), digest.hexdigest()
    except OSError:
        return None


def _entry(bundle_dir: Path, plan: PointPlan) -> dict[str, Any] | None:
    """The bundle's entry of the plan's target, or None."""
    try:
        meta = read_meta(bundle_dir)
    except (BundleError, OSError):
        return None
    per_tp = meta.get("per_tp")
    if not isinstance(per_tp, dict):
        return None
    record = per_tp.get(plan.target.tp, per_tp.get(str(plan.target.tp)))
    owner = record.get("moe_components") if isinstance(record, dict) else None
    entries = owner.get("entries") if isinstance(owner, dict) else None
    for entry in entries if isinstance(entries, list) else ():
        if isinstance(entry, dict) and entry.get("target") == plan.target.as_dict():
            return entry
    return None


def _published_facts(entry: dict[str, Any]) -> tuple[str, str, str, int] | None:
    """(table, table_sha256, point_plan_sha256, points) of a bundle entry, where well formed."""
    try:
        sampling = entry["contract"]["expert_sampling"]
        return (
            str(entry["table"]),
            str(entry["coverage"]["table_sha256"]),
            str(sampling["point_plan_sha256"]),
            int(sampling["points"]),
        )
    except (KeyError, TypeError, ValueError):
        return None


def write_marker(request: AcquisitionRequest, requested: PointPlan, published: PointPlan) -> None:
    """Record that ``published`` (the admitted plan of ``requested``) is in the bundle now.

    Called after the target's publish returned and its checkpoint was closed. A kill before
    this write leaves no marker: the next run takes the full path, as before.
    """
    work = request.work_dir(requested.target)
    samples = _file_digest(work / SAMPLES)
    entry = _entry(request.bundle_dir, published)
    facts = _published_facts(entry) if entry is not None else None
    if samples is None or facts is None or facts[2] != published.sha256:
        return
    backend = entry["contract"].get("backend", {}) if entry is not None else {}
    record = {
        "schema": _SCHEMA,
        "key": request_key(request, requested),
        "samples_bytes": samples[0],
        "samples_sha256": samples[1],
        "table": facts[0],
        "table_sha256": facts[1],
        "published_plan_sha256": facts[2],
        "points": facts[3],
        "backend": backend.get("name") if isinstance(backend, dict) else None,
    }
    path = work / MARKER
    partial = path.with_suffix(".json.partial")
    partial.write_text(json.dumps(record, sort_keys=True, indent=1) + "\n", encoding="utf-8")
    partial.replace(path)


def finished_target(request: AcquisitionRequest, plan: PointPlan) -> FinishedTarget | None:
    """The published target a resume may skip, or None where the full path must run."""
    try:
        record = json.loads((request.work_dir(plan.target) / MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or record.get("schema") != _SCHEMA:
        return None
    if record.get("key") != request_key(request, plan):
        return None
    samples = _file_digest(request.work_dir(plan.target) / SAMPLES)
    if samples != (record.get("samples_bytes"), record.get("samples_sha256")):
        return None
    entry = _entry(request.bundle_dir, plan)
    facts = _published_facts(entry) if entry is not None else None
    expected = (
        record.get("table"),
        record.get("table_sha256"),
        record.get("published_plan_sha256"),
        record.get("points"),
    )
    if facts is None or facts != expected or entry is None:
        return None
    backend = entry["contract"].get("backend", {})
    if not isinstance(backend, dict) or backend.get("name") != record.get("backend"):
        return None
    table = _file_digest(request.bundle_dir / f"tp{plan.target.tp}" / facts[0])
    if table is None or table[1] != facts[1]:
        return None
    return FinishedTarget(points=facts[3], backend=str(record["backend"]), plan_sha256=facts[2])


def split_finished(
    request: AcquisitionRequest, plans: Iterable[PointPlan]
) -> tuple[list[PointPlan], list[tuple[PointPlan, FinishedTarget]]]:
    """The plans still to run, and the published ones a resume skips, in plan order."""
    pending: list[PointPlan] = []
    finished: list[tuple[PointPlan, FinishedTarget]] = []
    for plan in plans:
        done = finished_target(request, plan)
        if done is None:
            pending.append(plan)
        else:
            finished.append((plan, done))
    return pending, finished
