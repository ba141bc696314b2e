"""Lookups over REST: the same `moetables.lookup` answers, with tables cached per process.

A ComponentTables object keeps its loaded deployments (and absent coverage) for the life of
the worker process, as the method requires; this module keeps one per bundle content hash,
least recently used first out when more bundles are in use than the configured bound.

The request is checked here by hand rather than by a DRF serializer: a one-query lookup
must cost well under a millisecond, and the serializer alone costs about one.
"""

from __future__ import annotations

import re
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, connection, connections

from moetables.errors import BundleError, CoverageError
from moetables.lookup import ComponentTables
from registry.models import Bundle
from registry.services.checkout import BlobDriftError, BlobMissingError, checkout_bundle

__all__ = [
    "BundleRef",
    "LookupRequest",
    "LookupRequestError",
    "answer_lookup",
    "clear_lookup_cache",
    "name_lookup_filter",
    "parse_lookup_request",
    "resolve_bundle",
    "run_lookup",
    "tables_for",
]

_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_lock = threading.Lock()
_tables: OrderedDict[str, Any] = OrderedDict()
# Per thread: the database stamp and the bundles resolved under it (at most this many).
_resolved = threading.local()
RESOLVED_LIMIT = 1024


class LookupRequestError(ValueError):
    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems


@dataclass(frozen=True, slots=True)
class LookupRequest:
    bundle_id: int | None
    sha256: str | None
    name: tuple[str, str, str] | None  # hardware, model, variant: the latest such bundle
    tp: int
    dp: int
    rank: int
    sequence_parallel: bool
    queries: list[Any]
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


@dataclass(frozen=True, slots=True)
class BundleRef:
    id: int
    sha256: str


# Bundle ids are 64-bit database keys: a larger number names no bundle and overflows the query.
_ID_MAX = 2**63 - 1


def _is_text(value: str) -> bool:
    # NUL: PostgreSQL refuses it in a query parameter (a 500; issue 17, item 8).
    if "\x00" in value:
        return False
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _count(raw: Any, key: str, low: int, problems: list[str]) -> int:
    value = raw.get(key)
    if isinstance(value, bool) or not isinstance(value, int):
        problems.append(f"target.{key}: must be an integer, got {value!r}")
        return low
    if value < low:
        problems.append(f"target.{key}: must be at least {low}, got {value}")
    return value


def parse_lookup_request(data: Any, *, max_queries: int) -> LookupRequest:
    """Check the envelope; the queries go to moetables as they are (each gets its answer)."""
    if not isinstance(data, dict):
        raise LookupRequestError(["the body must be a JSON object"])
    problems: list[str] = []
    queries = data.get("queries", [])
    if not isinstance(queries, list):
        problems.append("queries: must be a list of query objects")
    elif len(queries) > max_queries:
        problems.append(f"queries: at most {max_queries} queries per request")
    bundle_id = data.get("bundle")
    sha256 = data.get("sha256")
    names = [data.get(k) for k in ("hardware", "model", "variant")]
    given = [n for n in names if n is not None]
    ways = (bundle_id is not None) + (sha256 is not None) + bool(given)
    if ways != 1:
        problems.append(
            "name the bundle one way: bundle (id), sha256, or hardware + model + variant"
        )
    if bundle_id is not None and (
        isinstance(bundle_id, bool) or not isinstance(bundle_id, int)
        or not 1 <= bundle_id <= _ID_MAX
    ):
        problems.append(f"bundle: must be a positive integer id, got {bundle_id!r}")
    if sha256 is not None and not (isinstance(sha256, str) and _SHA256.match(sha256)):
        problems.append("sha256: must be 64 lowercase hexadecimal digits")
    if given and (len(given) != 3 or not all(isinstance(n, str) and n for n in given)):
        problems.append("hardware, model and variant go together, as non-empty strings")
    elif given and not all(_is_text(n) for n in given):
        # JSON can carry lone surrogates; no database can store or compare them.
        problems.append("hardware, model and variant must be valid Unicode text without NUL")
    raw = data.get("target")
    tp = dp = 1
    rank = 0
    sp = False
    if not isinstance(raw, dict):
        problems.append("target: must be an object with tp, dp, rank (and sequence_parallel)")
    else:
        tp = _count(raw, "tp", 1, problems)
        dp = _count(raw, "dp", 1, problems)
        rank = _count(raw, "rank", 0, problems)
        sp = raw.get("sequence_parallel", False)
        if not isinstance(sp, bool):
            problems.append(f"target.sequence_parallel: must be true or false, got {sp!r}")
        ep = raw.get("ep", tp * dp)
        if ep != tp * dp:
            problems.append(
                f"target.ep: ep must equal tp*dp = {tp * dp} (full expert parallelism), "
                f"got {ep!r}"
            )
        elif rank >= tp * dp:
            problems.append(f"target.rank: rank must be below ep = {tp * dp}, got {rank}")
    include_exploratory = data.get("include_exploratory", False)
    if not isinstance(include_exploratory, bool):
        problems.append(f"include_exploratory: must be true or false, got {include_exploratory!r}")
    if problems:
        raise LookupRequestError(problems)
    return LookupRequest(
        bundle_id=bundle_id,
        sha256=sha256,
        name=(names[0], names[1], names[2]) if given else None,
        tp=tp,
        dp=dp,
        rank=rank,
        sequence_parallel=sp,
        queries=queries,
        include_exploratory=include_exploratory,
    )


def _database_stamp() -> tuple[Any, int, int] | None:
    """A value that changes whenever the database may have, read without a query; None
    where there is none (PostgreSQL: there every lookup asks the database).

    On SQLite: this thread's connection, its ``PRAGMA data_version`` (which changes when any
    other connection, of this process or another, commits a change) and its total_changes
    (the rows it has written itself, committed or not).
    """
    db = connections[DEFAULT_DB_ALIAS]  # the thread's connection, looked up once
    if db.vendor != "sqlite":
        return None
    if db.connection is None:
        db.ensure_connection()
    raw = db.connection
    (version,) = raw.execute("PRAGMA data_version").fetchone()
    return raw, version, raw.total_changes


def resolve_bundle(request: LookupRequest) -> BundleRef | None:
    """The bundle the request names, by one indexed query.

    Written as SQL because it runs once per lookup request, and building the same query
    through the ORM costs more than answering a small batch. Where the database tells
    cheaply that nothing has changed since (``_database_stamp``), the thread reuses what it
    found: a publication or a deletion anywhere changes the stamp.
    """
    stamp = _database_stamp()
    if stamp is None:
        return _query_bundle(request)
    memo = _resolved.__dict__
    if memo.get("stamp") != stamp:
        memo["stamp"], memo["found"] = stamp, {}
    found: dict[Any, BundleRef | None] = memo["found"]
    key = (request.bundle_id, request.sha256, request.name, request.include_exploratory)
    if key not in found:
        ref = _query_bundle(request)
        if len(found) >= RESOLVED_LIMIT:
            found.clear()
        found[key] = ref
    return found[key]


def name_lookup_filter(include_exploratory: bool) -> str:
    """The SQL condition a lookup *by name* adds: exploratory bundles (a B/2B tolerance looser
    than the method's 3 %) answer only when asked. An id or a sha256 names one bundle
    exactly and is answered whatever its quality."""
    return "" if include_exploratory else " AND NOT exploratory"


def _query_bundle(request: LookupRequest) -> BundleRef | None:
    table = connection.ops.quote_name(Bundle._meta.db_table)
    if request.bundle_id is not None:
        where, params = "id = %s", [request.bundle_id]
    elif request.sha256 is not None:
        where, params = "sha256 = %s", [request.sha256]
    else:
        assert request.name is not None
        where = "hardware = %s AND model = %s AND variant = %s" + name_lookup_filter(
            request.include_exploratory
        )
        params = list(request.name)
    sql = f"SELECT id, sha256 FROM {table} WHERE {where} ORDER BY published_at DESC, id DESC"
    with connection.cursor() as cursor:
        cursor.execute(sql + " LIMIT 1", params)
        row = cursor.fetchone()
    return BundleRef(int(row[0]), str(row[1])) if row is not None else None


def tables_for(ref: BundleRef) -> Any:
    """The process's ComponentTables of the bundle (checked out from storage on first use)."""
    with _lock:
        tables = _tables.get(ref.sha256)
        # A checkout discarded (verify_bundles) or deleted under a worker: rebuilt, not 409
        # until a restart (issue 17, item 6). One stat per request.
        if tables is not None and not tables.bundle.root.is_dir():
            del _tables[ref.sha256]
            tables = None
        if tables is not None:
            _tables.move_to_end(ref.sha256)
            return tables
    tables = ComponentTables(checkout_bundle(Bundle.objects.get(pk=ref.id)))
    with _lock:
        tables = _tables.setdefault(ref.sha256, tables)
        _tables.move_to_end(ref.sha256)
        while len(_tables) > settings.REGISTRY["LOOKUP_CACHE_BUNDLES"]:
            _tables.popitem(last=False)
    return tables


def clear_lookup_cache() -> None:
    with _lock:
        _tables.clear()
    _resolved.__dict__.clear()


def answer_lookup(ref: BundleRef, request: LookupRequest) -> list[dict[str, Any]]:
    """One answer per query, as ``python -m moetables lookup`` prints them.

    Raises CoverageError when the bundle has no table for the target, BundleError when the
    stored bundle turns out corrupt.
    """
    deployment = tables_for(ref).deployment(
        request.tp, request.dp, request.rank, sequence_parallel=request.sequence_parallel
    )
    answers: list[dict[str, Any]] = deployment.answer(request.queries)
    return answers


def run_lookup(data: Any) -> tuple[int, dict[str, Any]]:
    """A whole lookup, from the parsed request body to the HTTP status and the JSON body."""
    try:
        request = parse_lookup_request(data, max_queries=settings.REGISTRY["MAX_LOOKUP_QUERIES"])
    except LookupRequestError as exc:
        return 400, {"error": "invalid", "problems": exc.problems}
    except RecursionError:  # the repr of a value nested ~1,000 deep in a message
        return 400, {"error": "invalid", "problems": ["the request is nested too deeply"]}
    ref = resolve_bundle(request)
    if ref is None:
        return 404, {"error": "not_found", "message": "no published bundle matches"}
    try:
        answers = answer_lookup(ref, request)
    except CoverageError as exc:
        return 422, {"error": "no_coverage", "message": str(exc)}
    except BlobMissingError as exc:
        return 503, {"error": "storage_fault", "message": str(exc)}
    except (BundleError, BlobDriftError) as exc:
        return 409, {"error": "corrupt_bundle", "message": str(exc)}
    except RecursionError:
        return 400, {"error": "invalid", "problems": ["a query is nested too deeply"]}
    return 200, {
        "bundle": {"id": ref.id, "sha256": ref.sha256},
        "target": request.target,
        "answers": answers,
    }
