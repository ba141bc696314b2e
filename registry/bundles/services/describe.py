"""What the registry indexes about a validated bundle, read from its metadata and tables.

Every value here comes from `moetables`' reading of the bundle; nothing is inferred from
folder names. Missing optional fields stay empty rather than guessed.
"""

from __future__ import annotations

import base64
import datetime as dt
import math
from typing import TYPE_CHECKING, Any

from django.utils.dateparse import parse_datetime

from moetables.bundle import EXPERTS, Bundle, ComponentTable, TableEntry

if TYPE_CHECKING:
    from collections.abc import Iterable

    import numpy as np

__all__ = [
    "backend_of",
    "expert_loads_of_meta",
    "jsonable",
    "measured_at_of",
    "measured_at_of_meta",
    "measured_at_problems",
    "table_fields",
    "table_identity",
    "table_measured_at",
    "vllm_version_of",
    "vllm_version_of_meta",
]


def jsonable(value: Any) -> Any:
    """YAML allows keys and values JSON does not (int keys, timestamps, NaN, bytes)."""
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [jsonable(v) for v in value]
    if isinstance(value, bool | int | str) or value is None:
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, dt.datetime | dt.date | dt.time):
        return value.isoformat()
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    return str(value)


def _strings(values: Iterable[Any]) -> str:
    for value in values:
        if isinstance(value, str) and value.strip():
            return value.strip()
    return ""


def _get(mapping: Any, *keys: str) -> Any:
    for key in keys:
        if not isinstance(mapping, dict):
            return None
        mapping = mapping.get(key)
    return mapping


def _moe_records(meta: dict[str, Any]) -> list[Any]:
    legacy = _get(meta, "moe_components", "per_tp")
    return list(legacy.values()) if isinstance(legacy, dict) else []


def expert_loads_of_meta(meta: Any, target: dict[str, Any]) -> dict[str, Any]:
    """An entry's ``expert_loads`` as the bundle states it (format 3, issue 18); every other
    entry, and every historical one, holds balanced rows and no fitted tile model."""
    entries = _get(meta, "per_tp", str(target.get("tp")), "moe_components", "entries")
    for entry in entries if isinstance(entries, list) else []:
        raw = _get(entry, "target")
        if isinstance(raw, dict) and all(
            raw.get(k) == target.get(k) for k in ("tp", "dp", "rank", "sequence_parallel")
        ):
            loads = _get(entry, "expert_loads")
            if isinstance(loads, dict):
                return dict(jsonable(loads))
    return {"rows": "balanced"}


def table_identity(contract: Any) -> dict[str, Any]:
    """What executed a table's expert region, from its contract: the execution path
    (``backend``: the adapter, e.g. vllm-modular, vllm-live, torch-reference), the kernel
    backend vLLM resolved (``kernel``, e.g. TRITON), whether vLLM's own kernels ran
    (``native``) and the vLLM version.

    Current contracts say all of it in ``backend`` (a mapping). Historical contracts (the
    LLMServingSim profiler's ``expert_region``) name the kernel and the vLLM version; their
    region schema ``native-modular-expert-region-*`` is vLLM's native modular kernel, the
    path our ``vllm-modular`` adapter measures, so they are listed under that name.
    """
    c: dict[str, Any] = contract if isinstance(contract, dict) else {}
    raw_backend, raw_region = c.get("backend"), c.get("expert_region")
    structured: dict[str, Any] = raw_backend if isinstance(raw_backend, dict) else {}
    region: dict[str, Any] = raw_region if isinstance(raw_region, dict) else {}
    kernel = _strings(
        [
            structured.get("native_backend"),
            c.get("native_backend"),
            _get(c, "native_backend", "name"),
            region.get("backend"),
            c.get("expert_backend"),
        ]
    )[:128]
    backend = _strings([structured.get("name"), c.get("backend")])
    schema = region.get("schema")
    if not backend and isinstance(schema, str) and schema.startswith("native-modular-"):
        backend = "vllm-modular"
    native = structured.get("native")
    if not isinstance(native, bool):
        # A kernel vLLM resolved natively, without a structured record that says otherwise.
        native = bool(kernel) or backend.startswith("vllm-")
    vllm = _strings(
        [
            structured.get("vllm_version"),
            c.get("vllm_version"),
            _get(c, "versions", "vllm"),
            _get(c, "observations", "vllm_version"),
            region.get("vllm_version"),
        ]
    )[:64]
    return {"backend": backend[:128], "kernel": kernel, "native": native, "vllm_version": vllm}


def vllm_version_of_meta(meta: Any, contracts: Iterable[Any]) -> str:
    """The root's vllm_version, else the MoE index's, else the first contract's."""
    meta = meta if isinstance(meta, dict) else {}
    candidates: list[Any] = [meta.get("vllm_version")]
    candidates += [_get(r, "vllm_version") for r in _moe_records(meta)]
    candidates += [table_identity(c)["vllm_version"] for c in contracts]
    return _strings(candidates)[:64]


def vllm_version_of(bundle: Bundle) -> str:
    return vllm_version_of_meta(bundle.meta, [entry.contract for entry in bundle.entries])


def backend_of(entry: TableEntry) -> str:
    """The execution path (adapter) that measured the entry (``table_identity``)."""
    return str(table_identity(entry.contract)["backend"])


def _datetime(raw: Any) -> dt.datetime | None:
    if isinstance(raw, dt.datetime):
        value = raw
    elif isinstance(raw, str):
        try:
            parsed = parse_datetime(raw.strip())
        except ValueError:
            return None
        if parsed is None:
            return None
        value = parsed
    else:
        return None
    return value if value.tzinfo else value.replace(tzinfo=dt.UTC)


def _stated_times_meta(meta: Any, coverages: Iterable[Any]) -> Iterable[tuple[str, Any]]:
    """(where, raw value) of every measurement time stated, MoE records first."""
    legacy = _get(meta, "moe_components", "per_tp")
    if isinstance(legacy, dict):
        for tp, record in legacy.items():
            yield f"meta.yaml:moe_components.per_tp.{tp}.measured_at", _get(record, "measured_at")
    for i, coverage in enumerate(coverages):
        for key in ("measured_at", "completed_at"):
            yield f"table {i} coverage:{key}", _get(coverage, key)


def _root_times(meta: Any) -> list[tuple[str, Any]]:
    """The root's own times, then the MoE category's provenance (current bundles state their
    measurement time only there: ``category_provenance.moe.profiled_at``)."""
    return [
        ("meta.yaml:measured_at", _get(meta, "measured_at")),
        ("meta.yaml:profiled_at", _get(meta, "profiled_at")),
        (
            "meta.yaml:category_provenance.moe.profiled_at",
            _get(meta, "category_provenance", "moe", "profiled_at"),
        ),
    ]


def _table_times(contract: Any, coverage: Any) -> Iterable[tuple[str, Any]]:
    """(where, raw value) of the times one table's own records state: its coverage's, the
    start of each acquisition context (a resumed run lists one per call: the last is when its
    last points were measured) and its provenance's start."""
    for key in ("measured_at", "completed_at"):
        yield f"coverage:{key}", _get(coverage, key)
    contexts = _get(contract, "provenance", "acquisition_contexts")
    if isinstance(contexts, list):
        for i, context in enumerate(contexts):
            where = f"contract:provenance.acquisition_contexts[{i}].started_at"
            yield where, _get(context, "started_at")
    yield "contract:provenance.started_at", _get(contract, "provenance", "started_at")


def _stated_times(bundle: Bundle) -> Iterable[tuple[str, Any]]:
    """(where, raw value) of every measurement time the bundle states, MoE records first."""
    legacy = _get(bundle.meta, "moe_components", "per_tp")
    if isinstance(legacy, dict):
        for tp, record in legacy.items():
            yield f"meta.yaml:moe_components.per_tp.{tp}.measured_at", _get(record, "measured_at")
    for entry in bundle.entries:
        for where, raw in _table_times(entry.contract, entry.coverage):
            yield f"{entry.where} {where}", raw


def measured_at_problems(bundle: Bundle) -> list[str]:
    """Measurement times that parse but cannot be stored (issue 17, item 3), by field."""
    from registry.checks import check_datetime

    stated = [*_stated_times(bundle), *_root_times(bundle.meta)]
    problems = []
    for where, raw in stated:
        value = _datetime(raw)
        if value is not None and (why := check_datetime(value)) is not None:
            problems.append(f"{where}: {why}")
    return problems


def _usable(raw: Any) -> dt.datetime | None:
    from registry.checks import check_datetime

    # Publication refuses unstorable times first; skipping them here keeps max() safe.
    value = _datetime(raw)
    return value if value is not None and check_datetime(value) is None else None


def table_measured_at(contract: Any, coverage: Any) -> dt.datetime | None:
    """When one table's points were measured: the latest time its coverage or contract states.

    A bundle's tables need not share a day: a rank measured later is moved in beside an older
    DP1 table (`acquisition.transplant`), and the lookup's choice between bundles is per
    target, so it ranks each table by its own time."""
    found = [v for _, raw in _table_times(contract, coverage) if (v := _usable(raw)) is not None]
    return max(found) if found else None


def measured_at_of_meta(
    meta: Any, coverages: Iterable[Any], contracts: Iterable[Any] = ()
) -> dt.datetime | None:
    """The latest measurement time any MoE record, coverage or (given its tables' contracts)
    table states, else the root's, else the MoE category's provenance."""
    found = [v for _, raw in _stated_times_meta(meta, coverages) if (v := _usable(raw)) is not None]
    found += [t for c in contracts if (t := table_measured_at(c, None)) is not None]
    if found:
        return max(found)
    for _, raw in _root_times(meta):
        if (value := _usable(raw)) is not None:
            return value
    return None


def measured_at_of(bundle: Bundle) -> dt.datetime | None:
    return measured_at_of_meta(
        bundle.meta,
        [entry.coverage for entry in bundle.entries],
        [entry.contract for entry in bundle.entries],
    )


def _range(values: np.ndarray[Any, Any]) -> tuple[int | None, int | None]:
    if values.size == 0:
        return None, None
    return int(values.min()), int(values.max())


def table_fields(entry: TableEntry, table: ComponentTable) -> dict[str, Any]:
    """The DeploymentTable columns of one entry."""
    experts = table.component == EXPERTS
    tokens = _range(table.tokens[experts])
    active = _range(table.activated_experts[experts])
    pairs = _range(table.local_assignments[experts])
    local = _range(table.tokens[~experts])
    target = entry.target
    return {
        "tp": target.tp,
        "dp": target.dp,
        "ep": target.ep,
        "rank": target.rank,
        "sequence_parallel": target.sequence_parallel,
        "table_path": entry.table_path,
        "table_sha256": entry.table_sha256,
        "contract": jsonable(entry.contract),
        "contract_id": entry.contract_id or "",
        "coverage": jsonable(entry.coverage),
        "measured_at": table_measured_at(entry.contract, entry.coverage),
        "components": list(entry.components),
        "modes": list(entry.modes),
        **table_identity(entry.contract),
        "row_count": len(table),
        "tokens_min": tokens[0],
        "tokens_max": tokens[1],
        "activated_experts_min": active[0],
        "activated_experts_max": active[1],
        "local_assignments_min": pairs[0],
        "local_assignments_max": pairs[1],
        "local_tokens_min": local[0],
        "local_tokens_max": local[1],
    }
