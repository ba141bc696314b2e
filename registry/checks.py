"""Every value a publication would write, checked before the transaction (issue 17, items 3, 5).

The database is the wrong place to find out that a value does not fit: PostgreSQL answers a
NUL in a string, a lone surrogate, 40,000 in a smallint or a timestamp past year 9999 with an
error in the middle of the transaction (a 500), and SQLite stores most of them silently, so
the same bundle was refused on one and kept on the other. Here each row is checked against
its own column types, the same on every backend, and each problem names its file and field.
"""

from __future__ import annotations

import datetime as dt
from typing import TYPE_CHECKING, Any

from django.db import models
from django.db.backends.base.operations import BaseDatabaseOperations

if TYPE_CHECKING:
    from collections.abc import Iterator

__all__ = [
    "MAX_JSON_DEPTH",
    "MEASURED_AT_RANGE",
    "check_datetime",
    "check_row",
    "check_text",
    "json_problems",
]

# Portable column ranges: SQLite would store anything, PostgreSQL refuses mid-transaction.
_RANGES = BaseDatabaseOperations.integer_field_ranges
# A measurement time the registry accepts: later than the first GPU MoE kernels could have
# run, well before any calendar arithmetic overflows (year 1 - 14 h, year 9999 + 14 h).
MEASURED_AT_RANGE = (
    dt.datetime(1970, 1, 1, tzinfo=dt.UTC),
    dt.datetime(9000, 1, 1, tzinfo=dt.UTC),
)
MAX_JSON_DEPTH = 64


def check_text(value: str) -> str | None:
    """Why ``value`` cannot be stored as text, or None: NUL and lone surrogates cannot be."""
    if "\x00" in value:
        return "contains a NUL character"
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return "contains a lone surrogate (not valid Unicode text)"
    return None


def check_datetime(value: dt.datetime) -> str | None:
    """Why ``value`` is not a storable measurement time, or None."""
    try:
        utc = value.astimezone(dt.UTC) if value.tzinfo else value.replace(tzinfo=dt.UTC)
    except (OverflowError, ValueError):
        return f"{value.isoformat()} is outside the representable range of dates"
    low, high = MEASURED_AT_RANGE
    if not low <= utc < high:
        return (
            f"{value.isoformat()} is outside the accepted range "
            f"{low:%Y-%m-%d} .. {high:%Y-%m-%d} (UTC)"
        )
    return None


def json_problems(value: Any, where: str, depth: int = 0) -> Iterator[str]:
    """Problems of a JSON value: text that cannot be stored, nesting past MAX_JSON_DEPTH."""
    if depth > MAX_JSON_DEPTH:
        yield f"{where}: nested deeper than {MAX_JSON_DEPTH} levels"
        return
    if isinstance(value, str):
        if (why := check_text(value)) is not None:
            yield f"{where}: {why}"
    elif isinstance(value, dict):
        for key, item in value.items():
            name = str(key)
            if (why := check_text(name)) is not None:
                yield f"{where}: a key {why}"
                continue
            yield from json_problems(item, f"{where}.{name}", depth + 1)
    elif isinstance(value, list | tuple):
        for index, item in enumerate(value):
            yield from json_problems(item, f"{where}.{index}", depth + 1)


def check_row(
    instance: models.Model, where: str, sources: dict[str, str] | None = None
) -> list[str]:
    """Every reason a field of the unsaved ``instance`` would not fit its column.

    ``where`` names the row's origin (a file); ``sources`` maps a field to a more precise name
    (``hardware`` -> ``meta.yaml:hardware``).
    """
    sources = sources or {}
    problems: list[str] = []
    for field in instance._meta.concrete_fields:
        if field.primary_key or isinstance(field, models.ForeignKey):
            continue
        value = getattr(instance, field.attname)
        if value is None:
            continue
        name = sources.get(field.name, f"{where}: {field.name}")
        kind = field.get_internal_type()
        if isinstance(field, models.JSONField):
            problems.extend(json_problems(value, sources.get(field.name, f"{where}:{field.name}")))
        elif isinstance(value, str):
            if (why := check_text(value)) is not None:
                problems.append(f"{name} {why}")
            elif field.max_length is not None and len(value) > field.max_length:
                problems.append(f"{name} is longer than {field.max_length} characters")
        elif kind in _RANGES and isinstance(value, int) and not isinstance(value, bool):
            low, high = _RANGES[kind]
            if not low <= value <= high:
                problems.append(f"{name} = {value} is outside {low}..{high} (a {kind} column)")
        elif isinstance(value, dt.datetime) and (why := check_datetime(value)) is not None:
            problems.append(f"{name}: {why}")
    return problems
