"""Lookups over REST: which bundle answers, and the same `moetables` answers, cached per process.

The request itself is checked by `moetables.lookup.queries` (the one definition of a
well-formed lookup, shared with the CLI and the client). This module chooses the bundle that
answers it and asks `moetables`; it raises typed errors (``NoSuchBundle``, ``NoCoverage``,
``CorruptBundle``) that the HTTP edge (`registry.lookup.http`) maps to statuses.

A ComponentTables object keeps its loaded deployments (and absent coverage) for the life of
the worker process, as the method requires; this module keeps one per bundle content hash,
least recently used first out when more bundles are in use than the configured bound.
"""

from __future__ import annotations

import re
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, connection, connections
from django.db.backends.base.operations import BaseDatabaseOperations

from moetables.errors import BundleError, CoverageError
from moetables.lookup import ComponentTables, LookupRequest, parse_request
from registry.bundles.models import Bundle, DeploymentTable
from registry.bundles.services.checkout import BlobDriftError, BlobMissingError, checkout_bundle

__all__ = [
    "Answerer",
    "BundleRef",
    "CorruptBundle",
    "LookupFailure",
    "NoCoverage",
    "NoSuchBundle",
    "StorageFault",
    "answer_lookup",
    "choose_bundle",
    "clear_lookup_cache",
    "parse_lookup",
    "run_lookup",
    "tables_for",
]

_lock = threading.Lock()
_tables: OrderedDict[str, Any] = OrderedDict()
# Per thread: the database stamp and the choices made under it (at most this many).
_resolved = threading.local()
RESOLVED_LIMIT = 1024
# Names listed in a "no published bundle matches" answer (hardware, models or variants).
NEAR_NAMES = 12


class LookupFailure(Exception):
    """A lookup no bundle answers; the edge maps each kind to an HTTP status."""

    code = "failure"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class NoSuchBundle(LookupFailure):
    code = "not_found"


class NoCoverage(LookupFailure):
    code = "no_coverage"


class CorruptBundle(LookupFailure):
    code = "corrupt_bundle"


class StorageFault(LookupFailure):
    """A stored blob is missing: the registry's storage, not the bundle, is at fault."""

    code = "storage_fault"


@dataclass(frozen=True, slots=True)
class BundleRef:
    id: int
    sha256: str


@dataclass(frozen=True, slots=True)
class Answerer:
    """The bundle and table that answer a lookup, as every answer reports them."""

    id: int
    sha256: str
    backend: str
    kernel: str
    native: bool
    vllm_version: str

    @property
    def ref(self) -> BundleRef:
        return BundleRef(self.id, self.sha256)

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "sha256": self.sha256,
            "backend": self.backend,
            "kernel": self.kernel,
            "native": self.native,
            "vllm_version": self.vllm_version,
        }


def parse_lookup(data: Any, pins: Any = None) -> LookupRequest:
    """The request, checked by moetables (RequestError names every problem)."""
    return parse_request(
        data, max_queries=settings.REGISTRY["MAX_LOOKUP_QUERIES"], pins=pins or None
    )


def _version_key(text: str) -> tuple[tuple[int, int | str], ...]:
    """Newer vLLM versions sort higher: numeric parts by value ("0.28.0" > "0.9.1")."""
    return tuple(
        (1, int(part)) if part.isdigit() else (0, part) for part in re.split(r"[.+-]", text)
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


def choose_bundle(request: LookupRequest) -> Answerer:
    """The bundle that answers the request: the one it names by id or sha256, or among the
    bundles of its hardware + model + variant the best for its target.

    Best: it has a table for the target (and matches the ``backend`` / ``vllm_version``
    pins), then vLLM's own kernels before reference ones, then the newest vLLM, then the
    newest measurement of that table (the bundle's where the table states no time; then the
    newest publication). Raises NoSuchBundle or NoCoverage.

    Where the database tells cheaply that nothing has changed since (``_database_stamp``),
    the thread reuses its choice: a publication or a deletion anywhere changes the stamp.
    """
    stamp = _database_stamp()
    if stamp is None:
        return _choose(request)
    memo = _resolved.__dict__
    if memo.get("stamp") != stamp:
        memo["stamp"], memo["found"] = stamp, {}
    found: dict[Any, Answerer | LookupFailure] = memo["found"]
    key = (
        request.bundle_id,
        request.sha256,
        request.name,
        request.backend,
        request.vllm_version,
        request.tp,
        request.dp,
        request.rank,
        request.sequence_parallel,
        request.include_exploratory,
    )
    if key not in found:
        try:
            outcome: Answerer | LookupFailure = _choose(request)
        except LookupFailure as exc:
            outcome = exc
        if len(found) >= RESOLVED_LIMIT:
            found.clear()
        found[key] = outcome
    outcome = found[key]
    if isinstance(outcome, LookupFailure):
        raise type(outcome)(outcome.message)
    return outcome


def _bundle_filter(request: LookupRequest) -> tuple[list[str], list[Any]]:
    where: list[str] = []
    params: list[Any] = []
    if request.bundle_id is not None:
        where.append("b.id = %s")
        params.append(request.bundle_id)
    if request.sha256 is not None:
        where.append("b.sha256 = %s")
        params.append(request.sha256)
    if request.name is not None:
        where.append("b.hardware = %s AND b.model = %s AND b.variant = %s")
        params += list(request.name)
        if request.bundle_id is None and request.sha256 is None and not request.include_exploratory:
            # Exploratory bundles (a B/2B tolerance looser than the method's 3 %) answer a
            # name only when asked; an id or a sha256 names one bundle exactly.
            where.append("NOT b.exploratory")
    return where, params


_TARGET_RANGE = BaseDatabaseOperations.integer_field_ranges["PositiveSmallIntegerField"]


def _choose(request: LookupRequest) -> Answerer:
    """One indexed query over the candidate tables, ranked here (a handful of rows).

    Written as SQL because it runs once per lookup request, and building the same query
    through the ORM costs more than answering a small batch.
    """
    # A target beyond the columns' range (smallints) matches no table; sending it to the
    # database would overflow (SQLite: OverflowError past 64 bits, a 500; issue 17, item 8).
    low, high = _TARGET_RANGE
    if not all(low <= value <= high for value in (request.tp, request.dp, request.rank)):
        raise _why_none(request)
    bundles = connection.ops.quote_name(Bundle._meta.db_table)
    tables = connection.ops.quote_name(DeploymentTable._meta.db_table)
    where, params = _bundle_filter(request)
    where.append("t.tp = %s AND t.dp = %s AND t.rank = %s AND t.sequence_parallel = %s")
    params += [request.tp, request.dp, request.rank, request.sequence_parallel]
    if request.backend is not None:
        where.append("(t.backend = %s OR t.kernel = %s)")
        params += [request.backend, request.backend]
    if request.vllm_version is not None:
        where.append("t.vllm_version = %s")
        params.append(request.vllm_version)
    sql = (
        "SELECT b.id, b.sha256, t.backend, t.kernel, t.native, t.vllm_version, "
        f"COALESCE(t.measured_at, b.measured_at), b.published_at FROM {bundles} b JOIN {tables} t "
        f"ON t.bundle_id = b.id WHERE {' AND '.join(where)}"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        rows = cursor.fetchall()
    if not rows:
        raise _why_none(request)
    if len(rows) > 1:
        rows.sort(
            key=lambda r: (
                bool(r[4]),
                _version_key(r[5] or ""),
                r[6] is not None,
                r[6] or 0,
                r[7],
                r[0],
            ),
            reverse=True,
        )
    r = rows[0]
    return Answerer(int(r[0]), str(r[1]), str(r[2]), str(r[3]), bool(r[4]), str(r[5]))


def _describe_target(request: LookupRequest) -> str:
    return (
        f"TP{request.tp}/DP{request.dp}/EP{request.tp * request.dp} rank {request.rank} "
        f"sequence_parallel={str(request.sequence_parallel).lower()}"
    )


def _why_none(request: LookupRequest) -> LookupFailure:
    """No table answers: say whether no bundle matches at all, or which targets they cover."""
    named = Bundle.objects.all()
    if request.bundle_id is not None:
        named = named.filter(pk=request.bundle_id)
    if request.sha256 is not None:
        named = named.filter(sha256=request.sha256)
    if request.name is not None:
        hardware, model, variant = request.name
        named = named.filter(hardware=hardware, model=model, variant=variant)
        if request.bundle_id is None and request.sha256 is None and not request.include_exploratory:
            named = named.filter(exploratory=False)
    found = list(named.order_by("-published_at", "-id")[:20])
    if not found:
        near = _near_names(request) if request.name is not None else ""
        return NoSuchBundle("no published bundle matches" + (f": {near}" if near else ""))
    if (request.bundle_id or request.sha256) and request.backend is request.vllm_version is None:
        # One bundle named exactly: moetables words the refusal, as it does in process.
        try:
            tables_for(BundleRef(found[0].pk, found[0].sha256)).deployment(
                request.tp, request.dp, request.rank, request.sequence_parallel
            )
        except CoverageError as exc:
            return NoCoverage(str(exc))
        except BlobMissingError as exc:
            return StorageFault(str(exc))
        except (BundleError, BlobDriftError) as exc:
            return CorruptBundle(str(exc))
    pins = [
        f"{k}={v!r}"
        for k, v in (("backend", request.backend), ("vllm_version", request.vllm_version))
        if v is not None
    ]
    have = "; ".join(
        f"bundle {b.pk} ({', '.join(b.backends) or 'backend unknown'}, "
        f"vLLM {b.vllm_version or 'none'}): "
        + ", ".join(
            f"tp{t['tp']}/dp{t['dp']}_ep{t['ep']}_rank{t['rank']}_sp{int(t['sequence_parallel'])}"
            + (f" [{t.get('backend') or '?'}, vLLM {t.get('vllm_version') or 'none'}]")
            for t in b.targets
        )
        for b in found
    )
    return NoCoverage(
        f"no table for {_describe_target(request)}"
        + (f" with {' and '.join(pins)}" if pins else "")
        + f"; the bundles named cover: {have}"
    )


def _listed(values: Any) -> str:
    names = sorted(set(values))
    shown = ", ".join(repr(v) for v in names[:NEAR_NAMES])
    return shown + (f" and {len(names) - NEAR_NAMES} more" if len(names) > NEAR_NAMES else "")


def _near_names(request: LookupRequest) -> str:
    """For a name that matches no bundle: the first of hardware, model, variant that nobody
    published (with what is published in its place), so that a near miss (a case, a model
    name without its suffix, the FP8 checkpoint's own name) can be put right."""
    assert request.name is not None
    hardware, model, variant = request.name
    bundles = Bundle.objects.all()
    if not bundles.filter(hardware=hardware).exists():
        return (
            f"no bundle of hardware {hardware!r}; published hardware: "
            f"{_listed(bundles.values_list('hardware', flat=True))}"
        )
    there = bundles.filter(hardware=hardware)
    if not there.filter(model=model).exists():
        return (
            f"no bundle of model {model!r} on {hardware!r}; models there: "
            f"{_listed(there.values_list('model', flat=True))}"
        )
    there = there.filter(model=model)
    if not there.filter(variant=variant).exists():
        # A quantized checkpoint is its own model (Qwen3-30B-A3B-Instruct-2507-FP8, variant
        # fp8): name the models that do have the variant.
        elsewhere = Bundle.objects.filter(hardware=hardware, variant=variant)
        return (
            f"no bundle of variant {variant!r} of {model!r} on {hardware!r}; variants there: "
            f"{_listed(there.values_list('variant', flat=True))}"
            + (
                f"; {variant!r} is published for {_listed(elsewhere.values_list('model', flat=True))}"
                if elsewhere.exists()
                else ""
            )
        )
    named_only = request.bundle_id is None and request.sha256 is None
    if named_only and not request.include_exploratory:
        return 'its bundles are exploratory: ask with "include_exploratory": true'
    return ""


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


def answer_lookup(answerer: Answerer, request: LookupRequest) -> list[dict[str, Any]]:
    """One answer per query, as ``python -m moetables lookup`` prints them."""
    try:
        deployment = tables_for(answerer.ref).deployment(
            request.tp, request.dp, request.rank, sequence_parallel=request.sequence_parallel
        )
        answers: list[dict[str, Any]] = deployment.answer(request.queries)
    except CoverageError as exc:  # the index says a table exists; the bundle disagrees
        raise NoCoverage(str(exc)) from None
    except BlobMissingError as exc:
        raise StorageFault(str(exc)) from None
    except (BundleError, BlobDriftError) as exc:
        raise CorruptBundle(str(exc)) from None
    return answers


def run_lookup(request: LookupRequest) -> tuple[Answerer, dict[str, Any]]:
    """A whole lookup from a checked request: who answers, and the JSON body."""
    answerer = choose_bundle(request)
    answers = answer_lookup(answerer, request)
    return answerer, {"bundle": answerer.as_dict(), "target": request.target, "answers": answers}
