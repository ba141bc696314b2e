"""The one definition of a well-formed lookup: the request envelope and each query.

Everything that answers lookups reads requests through this module: ``python -m moetables
lookup`` (queries), ``DeploymentTables.answer`` (queries, by the column-wise reader below,
which accepts exactly what ``parse_query`` reads without converting anything), the registry's
POST /api/v1/lookup (the envelope: which bundle, which target, pins, queries) and
``moetables.client.RemoteTables`` (which checks its envelope here before sending it). A rule
written here once is kept by all of them.

A query is refused in place (its own ``invalid`` answer, the batch goes on); an envelope that
names no bundle, a target no deployment has, or keys nobody reads is refused whole, with every
problem named (``RequestError.problems``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from moetables.bundle import EXPERTS
from moetables.errors import QueryError

__all__ = [
    "ENVELOPE_KEYS",
    "PIN_KEYS",
    "QUERY_KEYS",
    "TARGET_KEYS",
    "LookupRequest",
    "Query",
    "RequestError",
    "counts_problem",
    "load_problem",
    "local_coordinates_problem",
    "parse_query",
    "parse_request",
    "read_columns",
]


@dataclass(frozen=True, slots=True)
class Query:
    component: str
    mode: str
    tokens: int
    activated_experts: int
    local_assignments: int
    # Issue 18: a load description (None: balanced, the table's own answer) and its tile cost.
    loads: Any = None
    tile_cost_us: float | None = None


def _int(raw: Mapping[str, Any], key: str, default: int | None = None) -> int:
    value = raw.get(key, default)
    if value is None:
        raise QueryError(f"{key} is required")
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise QueryError(f"{key} must be an integer, got {value!r}")
    return value


def local_coordinates_problem(component: str, a: int, m: int) -> str | None:
    """Why a scalar lookup of a local component refuses expert coordinates (``time_us``).

    ``answer`` reads a local component's row by its tokens alone (its batch never reads
    the expert coordinates); a scalar call that gives them is refused, so that a caller
    who meant experts learns it.
    """
    if component != EXPERTS and (a != -1 or m != -1):
        return f"{component} is a local component: give no expert coordinates"
    return None


def load_problem(
    component: str,
    loads: Any,
    tile_cost_us: Any,
    *,
    fitted_cost_us: float | None = None,
    check_cost: bool = True,
) -> str | None:
    """Why a load description (issue 18) cannot go with this query, or None.

    ``loads`` (None: absent) is ``"balanced"``, ``"uniform"``, ``"power_law(alpha)"`` or
    per-expert counts, for the experts component only; any but balanced needs a cost per
    extra row tile: ``tile_cost_us`` (a number >= 0, which needs a description) or else the
    table's own fitted one (``fitted_cost_us``, format 3's tile model). ``check_cost=False``
    leaves that to the table (a query parsed before its table is known).
    Whether explicit counts fit the query's (A, M) is ``counts_problem``'s.
    """
    if loads is None:
        if tile_cost_us is not None:
            return "tile_cost_us needs loads (a load description) to charge tiles for"
        return None
    if component != EXPERTS:
        return f"loads: a load description is for experts only, not {component!r}"
    from moetables.tiles import TileError, parse_loads

    try:
        kind, _ = parse_loads(loads)
    except TileError as exc:
        return str(exc)
    if tile_cost_us is None:
        if kind != "balanced" and check_cost and fitted_cost_us is None:
            return (
                f"loads={loads!r} needs tile_cost_us, a number >= 0 (us per row tile): this "
                "table records no fitted tile cost"
            )
        return None
    from moetables.tiles import MAX_TILE_COST_US, valid_tile_cost

    if not valid_tile_cost(tile_cost_us):
        hint = (
            ": leave it out to charge the table's own fitted cost ('table' is the estimate's)"
            if tile_cost_us == "table"
            else ""
        )
        return (
            f"tile_cost_us must be a finite number >= 0 (us per row tile, at most "
            f"{MAX_TILE_COST_US:,.0f}), got {tile_cost_us!r}" + hint
        )
    return None


def counts_problem(
    loads: Any,
    activated_experts: int,
    local_assignments: int,
    tokens: int | None = None,
    local_experts: int | None = None,
) -> str | None:
    """Why explicit per-expert counts do not describe A experts holding M pairs, or None; with
    ``tokens`` and ``local_experts`` (a table's), also a count above the N rows (a token picks
    an expert once) and more entries than the rank has local experts."""
    if isinstance(loads, str) or loads is None:
        return None
    counts = [int(c) for c in loads]
    total = sum(counts)
    active = sum(1 for c in counts if c > 0)
    if total != local_assignments or active != activated_experts:
        return (
            f"loads: the per-expert counts hold {total} pairs on {active} experts, "
            f"the query {local_assignments} pairs on {activated_experts}"
        )
    if local_experts is not None and len(counts) > local_experts:
        return (
            f"loads: {len(counts)} per-expert counts, but this rank has {local_experts} local "
            "experts"
        )
    if tokens is not None and counts and max(counts) > tokens:
        busiest = counts.index(max(counts))
        return (
            f"loads: expert {busiest} holds {counts[busiest]} pairs, but a token picks an expert "
            f"once: at most N={tokens}"
        )
    return None


# What one query may name; anything else is refused, never ignored (a key this reader does not
# know would otherwise be answered as if it were absent).
QUERY_KEYS = (
    "component",
    "mode",
    "tokens",
    "activated_experts",
    "local_assignments",
    "loads",
    "tile_cost_us",
)
_QUERY_SET = frozenset(QUERY_KEYS)
# The keys of a plain query, which the column reader answers in bulk: a query with a load
# description (issue 18) is read by ``parse_query`` and answered one by one.
_PLAIN_SET = frozenset(QUERY_KEYS[:5])


def parse_query(raw: Any) -> Query:
    """A query as the CLI and REST API accept it: one JSON object."""
    if not isinstance(raw, Mapping):
        raise QueryError("a query must be a JSON object")
    extra = raw.keys() - _QUERY_SET
    if extra:
        raise QueryError(
            f"unknown keys {', '.join(map(repr, sorted(map(str, extra))))}; a query takes "
            + ", ".join(QUERY_KEYS)
        )
    component = raw.get("component")
    mode = raw.get("mode", "eager")
    if not isinstance(component, str) or not isinstance(mode, str):
        raise QueryError("component and mode must be strings")
    tokens = _int(raw, "tokens")
    loads, tile_cost_us = raw.get("loads"), raw.get("tile_cost_us")
    if loads is not None or tile_cost_us is not None:
        problem = load_problem(component, loads, tile_cost_us, check_cost=False)
        if problem is not None:
            raise QueryError(problem)
    if component == EXPERTS:
        a, m = _int(raw, "activated_experts"), _int(raw, "local_assignments")
        if loads is None:
            return Query(component, mode, tokens, a, m)
        problem = counts_problem(loads, a, m, tokens)
        if problem is not None:
            raise QueryError(problem)
        return Query(
            component,
            mode,
            tokens,
            a,
            m,
            loads if isinstance(loads, str) else tuple(int(c) for c in loads),
            None if tile_cost_us is None else float(tile_cost_us),
        )
    return Query(
        component,
        mode,
        tokens,
        _int(raw, "activated_experts", -1),
        _int(raw, "local_assignments", -1),
    )


INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


def _lookup(table: Mapping[Any, int], keys: list[Any]) -> list[int]:
    """``table.get(key, -1)`` for each key; unhashable keys (a JSON list or object) get -1."""
    try:
        return [table.get(k, -1) for k in keys]
    except TypeError:
        found = []
        for k in keys:
            try:
                found.append(table.get(k, -1))
            except TypeError:
                found.append(-1)
        return found


def _int64(column: list[Any]) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.bool_]]:
    """The column as int64, and where it held a plain int that fits (-1 elsewhere)."""
    if set(map(type, column)) == {int}:
        try:
            return np.array(column, dtype=np.int64), np.ones(len(column), dtype=bool)
        except OverflowError:
            pass
    fits = [type(v) is int and INT64_MIN <= v <= INT64_MAX for v in column]
    values = [v if ok else -1 for v, ok in zip(column, fits, strict=True)]
    return np.array(values, dtype=np.int64), np.array(fits, dtype=bool)


# Batches this small are read query by query: array set-up would cost more than the reading.
FEW_QUERIES = 16


def _read_few(
    queries: Sequence[Any], groups: Mapping[tuple[str, str], int]
) -> tuple[list[Any], list[int]]:
    """``read_columns`` for a few queries, one at a time, by the same rule (lists, not arrays)."""
    columns: list[tuple[list[int], list[int], list[int], list[int]] | None] = [None] * len(groups)
    rest: list[int] = []
    for i, q in enumerate(queries):
        g = -1
        if type(q) is dict and not q.keys() - _PLAIN_SET:
            component, mode = q.get("component"), q.get("mode", "eager")
            n = q.get("tokens")
            a = q.get("activated_experts", -1)
            m = q.get("local_assignments", -1)
            if type(component) is str and type(mode) is str:
                g = groups.get((component, mode), -1)
            if (
                g >= 0
                and type(n) is int
                and type(a) is int
                and type(m) is int
                and all(INT64_MIN <= v <= INT64_MAX for v in (n, a, m))
                and (
                    component != EXPERTS or ("activated_experts" in q and "local_assignments" in q)
                )
            ):
                found = columns[g]
                if found is None:
                    found = columns[g] = ([], [], [], [])
                for column, value in zip(found, (i, n, a, m), strict=True):
                    column.append(value)
                continue
        rest.append(i)
    return list(columns), rest


def read_columns(
    queries: Sequence[Any], groups: Mapping[tuple[str, str], int]
) -> tuple[list[Any], list[int]]:
    """Well-formed queries of known (component, mode) ``groups``, read column by column.

    Well formed here: a dict of a known component and mode with plain int coordinates that
    fit int64, both expert coordinates given for experts, and no other key (a load
    description is left for ``parse_query``); ``parse_query`` reads exactly
    these without converting anything. Returns, per group in ``groups`` order, (rows,
    tokens, activated_experts, local_assignments) in query order (lists for a few queries,
    int64 arrays otherwise), or None; and the rows left for ``parse_query``.
    """
    count = len(queries)
    if count == 0:
        return [None] * len(groups), []
    if count <= FEW_QUERIES:
        return _read_few(queries, groups)
    if set(map(type, queries)) == {dict}:
        rows = np.arange(count)
        objects = list(queries)
    else:
        rows = np.array([i for i, q in enumerate(queries) if type(q) is dict], dtype=np.int64)
        objects = [queries[i] for i in rows.tolist()]
    components = [q.get("component") for q in objects]
    modes = [q.get("mode", "eager") for q in objects]
    try:
        one_mode = len(set(modes)) <= 1
    except TypeError:  # an unhashable mode
        one_mode = False
    if one_mode:
        mode = modes[0] if modes else "eager"
        of_mode = {c: g for (c, m), g in groups.items() if m == mode}
        group = np.array(_lookup(of_mode, components), dtype=np.int64)
    else:
        keys = [
            (c, m) if type(c) is str and type(m) is str else None
            for c, m in zip(components, modes, strict=True)
        ]
        group = np.array(_lookup(groups, keys), dtype=np.int64)
    n_col, good = _int64([q.get("tokens") for q in objects])
    # An absent expert coordinate reads as -1, as it does for a local component.
    a_col, a_ok = _int64([q.get("activated_experts", -1) for q in objects])
    m_col, m_ok = _int64([q.get("local_assignments", -1) for q in objects])
    good &= (group >= 0) & a_ok & m_ok
    good &= np.fromiter(map(_PLAIN_SET.issuperset, objects), dtype=bool, count=len(objects))
    expert = np.isin(group, [g for (c, _), g in groups.items() if c == EXPERTS])
    for i in np.flatnonzero(good & expert & ((a_col == -1) | (m_col == -1))).tolist():
        good[i] = "activated_experts" in objects[i] and "local_assignments" in objects[i]
    if len(rows) == count:
        taken = rows[~good].tolist()
    else:  # with the rows that are not dicts
        taken = sorted(set(range(count)) - set(rows[good].tolist()))
    parts: list[tuple[npt.NDArray[np.int64], ...] | None] = []
    picked = np.where(good, group, -1)
    for g in range(len(groups)):
        pick = np.flatnonzero(picked == g)
        parts.append((rows[pick], n_col[pick], a_col[pick], m_col[pick]) if pick.size else None)
    return parts, taken


# --- the envelope ------------------------------------------------------------------------

# Every key a lookup body may carry; anything else is refused, never ignored (a misspelt pin
# silently ignored would answer from another bundle than the caller meant).
ENVELOPE_KEYS = (
    "bundle",
    "sha256",
    "hardware",
    "model",
    "variant",
    "backend",
    "vllm_version",
    "include_exploratory",
    "target",
    "queries",
)
TARGET_KEYS = ("tp", "dp", "ep", "rank", "sequence_parallel")
_ENVELOPE_SET = frozenset(ENVELOPE_KEYS)
_TARGET_SET = frozenset(TARGET_KEYS)
# What a query string may pin (the same keys as in the body; both may not disagree).
PIN_KEYS = ("backend", "vllm_version", "bundle")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_DIGITS = re.compile(r"^[0-9]{1,19}$")
# Bundle ids are 64-bit database keys: a larger number names no bundle.
_ID_MAX = 2**63 - 1


class RequestError(ValueError):
    """A lookup envelope no bundle or deployment can answer; ``problems`` names each fault."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems


@dataclass(frozen=True, slots=True)
class LookupRequest:
    """A checked lookup envelope. The queries are kept as given: each gets its own answer."""

    tp: int
    dp: int
    rank: int
    sequence_parallel: bool
    queries: list[Any] = field(default_factory=list)
    bundle_id: int | None = None
    sha256: str | None = None
    name: tuple[str, str, str] | None = None  # hardware, model, variant
    backend: str | None = None
    vllm_version: str | None = None
    # A name also finds exploratory bundles (a B/2B tolerance looser than the method's 3 %).
    include_exploratory: bool = False

    @property
    def target(self) -> dict[str, Any]:
        return {
            "tp": self.tp,
            "dp": self.dp,
            "ep": self.tp * self.dp,
            "rank": self.rank,
            "sequence_parallel": self.sequence_parallel,
        }

    def body(self, queries: list[Any] | None = None) -> dict[str, Any]:
        """The JSON body that asks this request (with other queries, if given)."""
        out: dict[str, Any] = {}
        if self.bundle_id is not None:
            out["bundle"] = self.bundle_id
        if self.sha256 is not None:
            out["sha256"] = self.sha256
        if self.name is not None:
            out.update(zip(("hardware", "model", "variant"), self.name, strict=True))
        if self.backend is not None:
            out["backend"] = self.backend
        if self.vllm_version is not None:
            out["vllm_version"] = self.vllm_version
        if self.include_exploratory:
            out["include_exploratory"] = True
        target = self.target
        del target["ep"]
        out["target"] = target
        out["queries"] = self.queries if queries is None else queries
        return out


def _text_problem(key: str, value: Any) -> str | None:
    """Why ``value`` is no usable name (a non-empty string any database can store)."""
    if not isinstance(value, str) or not value:
        return f"{key}: must be a non-empty string, got {value!r}"
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:  # JSON can carry lone surrogates; no database stores them
        return f"{key}: must be valid Unicode text"
    if "\x00" in value:  # PostgreSQL cannot store or compare NUL in text
        return f"{key}: must be text without NUL characters"
    return None


def _count(raw: Mapping[str, Any], key: str, low: int, problems: list[str]) -> int:
    value = raw.get(key)
    if isinstance(value, bool) or not isinstance(value, int):
        problems.append(f"target.{key}: must be an integer, got {value!r}")
        return low
    if value < low:
        problems.append(f"target.{key}: must be at least {low}, got {value}")
    return value


def _bundle_ref(value: Any, problems: list[str]) -> tuple[int | None, str | None]:
    """``bundle``: a positive integer id or a sha256 (64 lowercase hexadecimal digits)."""
    if isinstance(value, str) and _SHA256.match(value):
        return None, value
    if isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= _ID_MAX:
        return value, None
    problems.append(f"bundle: must be a positive integer id or a sha256, got {value!r}")
    return None, None


def _merge_pins(
    data: Mapping[str, Any], pins: Mapping[str, str], problems: list[str]
) -> dict[str, Any]:
    """The body with the query string's pins added; a pin the body contradicts is a problem."""
    merged = dict(data)
    for key, raw in pins.items():
        if key not in PIN_KEYS:
            problems.append(
                f"query string: unknown parameter {key!r}; pins are {', '.join(PIN_KEYS)}"
            )
            continue
        value: Any = raw
        if key == "bundle" and _DIGITS.match(raw):
            value = int(raw)
        if key in merged and merged[key] != value:
            problems.append(f"{key}: the body says {merged[key]!r} and the query string {raw!r}")
            continue
        merged[key] = value
    return merged


def parse_request(
    data: Any, *, max_queries: int | None = None, pins: Mapping[str, str] | None = None
) -> LookupRequest:
    """Check a lookup envelope (a parsed JSON body, and the query string's ``pins``).

    The bundle is named by ``bundle`` (id or sha256) or ``sha256``, or by ``hardware`` +
    ``model`` + ``variant`` (then the best bundle for the target is chosen), or both (then the
    named bundle must carry that name); ``backend`` and ``vllm_version`` narrow the choice.
    Raises RequestError naming every problem.
    """
    if not isinstance(data, Mapping):
        raise RequestError(["the body must be a JSON object"])
    problems: list[str] = []
    if pins:
        data = _merge_pins(data, pins, problems)
    unknown = data.keys() - _ENVELOPE_SET
    if unknown:
        problems.append(
            f"unknown keys {', '.join(map(repr, sorted(map(str, unknown))))}; a lookup takes "
            + ", ".join(ENVELOPE_KEYS)
        )
    queries = data.get("queries", [])
    if not isinstance(queries, list):
        problems.append("queries: must be a list of query objects")
    elif max_queries is not None and len(queries) > max_queries:
        problems.append(f"queries: at most {max_queries} queries per request")
    bundle_id: int | None = None
    sha256: str | None = None
    if data.get("bundle") is not None:
        bundle_id, sha256 = _bundle_ref(data["bundle"], problems)
    if data.get("sha256") is not None:
        if not (isinstance(data["sha256"], str) and _SHA256.match(data["sha256"])):
            problems.append("sha256: must be 64 lowercase hexadecimal digits")
        elif data.get("bundle") is not None and data["bundle"] != data["sha256"]:
            problems.append("name the bundle once: bundle or sha256, not both")
        else:
            sha256 = data["sha256"]
    names = [data.get(k) for k in ("hardware", "model", "variant")]
    given = [n for n in names if n is not None]
    if given and len(given) != 3:
        problems.append("hardware, model and variant go together")
    elif given:
        problems += [
            p
            for k, n in zip(("hardware", "model", "variant"), names, strict=True)
            if (p := _text_problem(k, n)) is not None
        ]
    if data.get("bundle") is None and data.get("sha256") is None and not given:
        problems.append("name the bundle: bundle (id or sha256), or hardware + model + variant")
    pinned: dict[str, str | None] = {}
    for key in ("backend", "vllm_version"):
        value = data.get(key)
        if value is not None and (p := _text_problem(key, value)) is not None:
            problems.append(p)
        pinned[key] = value
    include_exploratory = data.get("include_exploratory", False)
    if not isinstance(include_exploratory, bool):
        problems.append(f"include_exploratory: must be true or false, got {include_exploratory!r}")
    raw = data.get("target")
    tp = dp = 1
    rank = 0
    sp = False
    if not isinstance(raw, Mapping):
        problems.append("target: must be an object with tp, dp, rank (and sequence_parallel)")
    else:
        extra = raw.keys() - _TARGET_SET
        if extra:
            problems.append(
                f"target: unknown keys {', '.join(map(repr, sorted(map(str, extra))))}; "
                f"a target takes {', '.join(TARGET_KEYS)}"
            )
        tp = _count(raw, "tp", 1, problems)
        dp = _count(raw, "dp", 1, problems)
        rank = _count(raw, "rank", 0, problems)
        sp = raw.get("sequence_parallel", False)
        if not isinstance(sp, bool):
            problems.append(f"target.sequence_parallel: must be true or false, got {sp!r}")
        ep = raw.get("ep", tp * dp)
        if ep != tp * dp:
            problems.append(
                f"target.ep: ep must equal tp*dp = {tp * dp} (full expert parallelism), got {ep!r}"
            )
        elif rank >= tp * dp:
            problems.append(f"target.rank: rank must be below ep = {tp * dp}, got {rank}")
        if sp is True and not (tp > 1 and dp > 1):
            # MoeTarget's own refusal, worded as the in-process QueryError is.
            problems.append(
                "target.sequence_parallel is only meaningful where tp > 1 and dp > 1 "
                f"(tp={tp} dp={dp})"
            )
    if problems:
        raise RequestError(problems)
    return LookupRequest(
        tp=tp,
        dp=dp,
        rank=rank,
        sequence_parallel=sp,
        queries=queries,
        bundle_id=bundle_id,
        sha256=sha256,
        name=(names[0], names[1], names[2]) if given else None,
        backend=pinned["backend"],
        vllm_version=pinned["vllm_version"],
        include_exploratory=include_exploratory,
    )
