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
    "jsonable",
    "measured_at_of",
    "measured_at_problems",
    "table_fields",
    "vllm_version_of",
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


def vllm_version_of(bundle: Bundle) -> str:
    """The root's vllm_version, else the MoE index's, else the first contract's."""
    candidates: list[Any] = [bundle.meta.get("vllm_version")]
    candidates += [_get(r, "vllm_version") for r in _moe_records(bundle.meta)]
    for entry in bundle.entries:
        c = entry.contract
        candidates += [
            c.get("vllm_version"),
            _get(c, "versions", "vllm"),
            _get(c, "observations", "vllm_version"),
            _get(c, "expert_region", "vllm_version"),
        ]
    return _strings(candidates)[:64]


def backend_of(entry: TableEntry) -> str:
    """The native expert backend the contract names (historical: expert_region.backend)."""
    c = entry.contract
    return _strings(
        [
            c.get("native_backend"),
            c.get("backend"),
            _get(c, "native_backend", "name"),
            _get(c, "backend", "name"),
            c.get("expert_backend"),
            _get(c, "expert_region", "backend"),
        ]
    )[:128]


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


def _stated_times(bundle: Bundle) -> Iterable[tuple[str, Any]]:
    """(where, raw value) of every measurement time the bundle states, MoE records first."""
    legacy = _get(bundle.meta, "moe_components", "per_tp")
    if isinstance(legacy, dict):
        for tp, record in legacy.items():
            yield f"meta.yaml:moe_components.per_tp.{tp}.measured_at", _get(record, "measured_at")
    for entry in bundle.entries:
        for key in ("measured_at", "completed_at"):
            yield f"{entry.where} coverage:{key}", entry.coverage.get(key)


def measured_at_problems(bundle: Bundle) -> list[str]:
    """Measurement times that parse but cannot be stored (issue 17, item 3), by field."""
    from registry.checks import check_datetime

    stated = [*_stated_times(bundle)]
    stated += [(f"meta.yaml:{key}", bundle.meta.get(key)) for key in ("measured_at", "profiled_at")]
    problems = []
    for where, raw in stated:
        value = _datetime(raw)
        if value is not None and (why := check_datetime(value)) is not None:
            problems.append(f"{where}: {why}")
    return problems


def measured_at_of(bundle: Bundle) -> dt.datetime | None:
    """The latest measurement time any MoE record states, else the root's."""
    from registry.checks import check_datetime

    def usable(raw: Any) -> dt.datetime | None:
        # Publication refuses unstorable times first; skipping them here keeps max() safe.
        value = _datetime(raw)
        return value if value is not None and check_datetime(value) is None else None

    found = [v for _, raw in _stated_times(bundle) if (v := usable(raw)) is not None]
    if found:
        return max(found)
    for key in ("measured_at", "profiled_at"):
        if (value := usable(bundle.meta.get(key))) is not None:
            return value
    return None


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
        "components": list(entry.components),
        "modes": list(entry.modes),
        "backend": backend_of(entry),
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
