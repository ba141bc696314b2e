"""What each dashboard page shows, as plain context dicts (the views only render them)."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

from django.http import Http404

from frontend import figures
from moetables.bundle import EXPERTS
from moetables.describe import kernel_segments, tile_costs
from moetables.errors import BundleError, CoverageError, QueryError
from moetables.lookup.explain import explain_expert
from registry.models import AcquisitionJob, Bundle, DeploymentTable
from registry.services.figures import load_deployment
from registry.services.quality import conservation_payload, stability_payload

FILTER_KEYS = (
    "q",
    "hardware",
    "model",
    "variant",
    "vllm_version",
    "tp",
    "dp",
    "ep",
    "backend",
    "kernel",
    "layout",
)


def _get(mapping: Any, *keys: str) -> Any:
    for key in keys:
        if not isinstance(mapping, Mapping):
            return None
        mapping = mapping.get(key)
    return mapping


def _first(*values: Any) -> str:
    for value in values:
        if value not in (None, "", [], {}):
            return str(value)
    return ""


def filter_choices() -> dict[str, list[Any]]:
    """Distinct values for the home page's filter menus (small: one query per column)."""
    bundles = Bundle.objects.order_by()
    tables = DeploymentTable.objects.order_by()

    pairs = list(tables.values_list("backend", "kernel").distinct())

    def distinct(qs: Any, field: str) -> list[Any]:
        return sorted(v for v in qs.values_list(field, flat=True).distinct() if v not in ("",))

    return {
        "hardware": distinct(bundles, "hardware"),
        "model": distinct(bundles, "model"),
        "variant": distinct(bundles, "variant"),
        "vllm_version": distinct(bundles, "vllm_version"),
        "tp": distinct(tables, "tp"),
        "dp": distinct(tables, "dp"),
        "ep": distinct(tables, "ep"),
        # adapters and kernels in one query (the home page's query count stays fixed)
        "backend": sorted({b for b, _ in pairs if b}),
        "kernel": sorted({k for _, k in pairs if k}),
    }


def filter_problems(
    errors: Mapping[str, list[str]],
    values: Mapping[str, str],
    choices: Mapping[str, list[Any]],
) -> tuple[list[str], list[str]]:
    """What is wrong with the home page's filters, in words that name the field and value.

    ``errors`` are the filterset's own (a value the filter cannot read, such as ``tp=two``:
    the list is not shown, as the API answers 400); ``unknown`` are readable values no
    published bundle has (``hardware=H100`` with none): the list is rightly empty, and the
    page says which values exist, since the menu cannot show a value it does not list.
    """
    invalid = [
        f"{key}: {values.get(key, '')!r} is not a valid value ({' '.join(messages)})"
        for key, messages in errors.items()
    ]
    unknown = []
    for key, known in choices.items():
        value = values.get(key, "")
        if value and key not in errors and value not in {str(v) for v in known}:
            listed = ", ".join(str(v) for v in known) or "none"
            unknown.append(f"{key}: no published bundle has {value!r} (known: {listed})")
    return invalid, unknown


def recent_jobs(limit: int = 10) -> list[AcquisitionJob]:
    """The newest acquisition jobs with their progress."""
    return list(AcquisitionJob.objects.select_related("result_bundle").order_by("-id")[:limit])


def _text(value: Any) -> str:
    """A scalar as text; a mapping or list (a structured contract field) is not a summary."""
    return "" if isinstance(value, Mapping | list) or value is None else str(value)


def contract_summary(contract: dict[str, Any], meta: dict[str, Any]) -> dict[str, str]:
    """GPU, versions, backend, geometry, dtypes, conditioning, from either layout's contract.

    Historical contracts keep the expert region in ``expert_region``; acquisition contracts keep
    a structured ``backend`` and the host in ``provenance``.
    """
    region = _get(contract, "expert_region") or {}
    backend: Mapping[str, Any] = (
        contract["backend"] if isinstance(contract.get("backend"), Mapping) else {}
    )
    origin = _get(contract, "provenance") or {}
    dtypes: Mapping[str, Any] = (
        backend["dtypes"] if isinstance(backend.get("dtypes"), Mapping) else {}
    )
    backend_name = _first(
        _text(contract.get("native_backend")),
        _text(contract.get("backend")),
        _text(backend.get("native_backend")),
        _text(region.get("backend")),
    )
    adapter = _text(backend.get("name"))
    return {
        "GPU": _first(
            _text(_get(contract, "gpu", "name")),
            _text(contract.get("gpu")),
            _text(origin.get("device_name")),
            _text(meta.get("gpu")),
        ),
        "vLLM": _first(
            _text(contract.get("vllm_version")),
            _text(_get(contract, "versions", "vllm")),
            _text(backend.get("vllm_version")),
            _text(region.get("vllm_version")),
            _text(meta.get("vllm_version")),
        ),
        "torch": _first(
            _text(contract.get("torch_version")),
            _text(_get(contract, "versions", "torch")),
            _text(origin.get("torch_version")),
        ),
        "CUDA": _first(
            _text(contract.get("cuda_version")),
            _text(_get(contract, "versions", "cuda")),
            _text(origin.get("cuda_version")),
            _text(meta.get("cuda_version")),
        ),
        "backend": f"{backend_name} ({adapter})" if adapter and backend_name else backend_name,
        "geometry": (
            f"E={contract.get('global_experts')} k={contract.get('global_top_k')} "
            f"L={contract.get('local_experts')} ({_first(contract.get('placement'), 'linear')})"
        ),
        "dtypes": _first(
            _text(contract.get("input_dtype")),
            _text(region.get("input_dtype")),
            ", ".join(
                f"{k} {v}" for k, v in dtypes.items() if k in ("hidden_states", "expert_weights")
            ),
        ),
        "conditioning": (
            f"{_first(_get(contract, 'expert_conditioning', 'schema'), 'B/2B banks')}, "
            f"tolerance {_first(_get(contract, 'expert_conditioning', 'quality_relative_tolerance'), 0.03)}"
        ),
    }


def coverage_summary(table: DeploymentTable) -> dict[str, str]:
    coverage = table.coverage
    stability = figures.stability(table.contract, coverage)
    rounds = _first(coverage.get("completed_rounds"))
    expected = coverage.get("expected_rounds")
    return {
        "complete": "yes" if coverage.get("complete") else "no",
        "rounds": f"{rounds} of {expected}" if expected else rounds,
        "rows": str(table.row_count),
        "table sha256": table.table_sha256,
        "conditioning": (
            f"{stability.checked} checked, {stability.failed} failed, max change "
            + (
                f"{stability.max_relative_change:.2%}"
                if stability.max_relative_change is not None
                else "n/a"
            )
            + f" (from {stability.source})"
        ),
    }


def bundle_summary(bundle: Bundle, tables: list[DeploymentTable]) -> dict[str, Any]:
    first = tables[0] if tables else None
    return {
        "contract": contract_summary(first.contract, bundle.meta) if first else {},
        "coverage": [(t, coverage_summary(t)) for t in tables],
    }


def _mode(table: DeploymentTable, raw: str | None) -> str:
    modes = [str(m) for m in table.modes]
    if raw is not None and raw in modes:
        return raw
    return "eager" if "eager" in modes else modes[0]


def mode_problem(table: DeploymentTable, raw: str | None) -> str | None:
    """Why ``raw`` (a query's ``mode``) is not a mode of this table, naming the allowed ones;
    None when it is one (or none was given). ``graph`` on an eager-only table has its own
    words on the table page (R14: new measurements are eager only)."""
    modes = [str(m) for m in table.modes]
    if raw is None or raw in modes:
        return None
    return f"mode: this table has no mode {raw!r}; allowed are {', '.join(modes)}"


def table_context(
    table: DeploymentTable, raw_m: str | None, raw_mode: str | None
) -> dict[str, Any]:
    loaded = load_deployment(table)
    geometry = loaded.lookups.entry.geometry
    mode = _mode(table, raw_mode)
    slices = figures.expert_slices(loaded.rows, geometry, table.bundle.layout, mode)
    chosen = slices[len(slices) // 2] if slices else None
    for s in slices:
        if raw_m is not None and str(s.pairs) == raw_m:
            chosen = s
    stability = figures.stability(table.contract, table.coverage)
    charts: dict[str, Any] = {
        "points": figures.expert_points_figure(loaded.rows, mode),
        "local": figures.local_curves_figure(loaded.rows),
    }
    if chosen is not None:
        charts["surface"] = figures.expert_slice_figure(
            loaded.lookups, loaded.rows, geometry, chosen, mode
        )
    evidence_error = None
    stable: dict[str, Any] | None
    conserved: dict[str, Any] | None
    try:
        stable = stability_payload(table)
        conserved = conservation_payload(table)
    except BundleError as exc:
        evidence_error = str(exc)
        stable = conserved = None
    if stable is not None:
        charts.update(figures.stability_figures(stable))
        peak = stable["summary"]["max_relative_change"]
        # The same rounding as the coverage card ("2.38%"), so the two never seem to disagree.
        stable["summary"]["max_change_text"] = f"{peak:.2%}" if peak is not None else "n/a"
    if conserved is not None and (fig := figures.conservation_figure(conserved)) is not None:
        charts["conservation"] = fig
    sel = loaded.rows.select(EXPERTS, mode) & (loaded.rows.activated_experts > 0)
    example = (
        (
            int(loaded.rows.tokens[sel][0]),
            int(loaded.rows.activated_experts[sel][0]),
            int(loaded.rows.local_assignments[sel][0]),
        )
        if sel.any()
        else (1, 1, geometry.top_k)
    )
    # What `python -m moetables info` prints for this entry, in its words (moetables.describe).
    entry = loaded.lookups.entry
    rows = loaded.rows
    segments = kernel_segments(
        entry, rows.tokens[(rows.component == EXPERTS) & (rows.activated_experts > 0)]
    )
    return {
        "table": table,
        "bundle": table.bundle,
        "geometry": geometry,
        "tile_costs": tile_costs(entry.expert_loads),
        "load_rows": entry.expert_loads.rows,
        "kernel_segments": segments or [],
        "mode": mode,
        "slices": slices,
        "chosen": chosen,
        "charts": charts,
        "stability": stability,
        "evidence": {"stability": stable, "conservation": conserved, "error": evidence_error},
        "graph_missing": raw_mode == "graph" and mode != "graph",
        # Any other mode the table lacks: the page falls back to its own and says so.
        "mode_problem": None if raw_mode == "graph" else mode_problem(table, raw_mode),
        "compact_change": (
            f"{stability.max_relative_change:.2%}"
            if stability.max_relative_change is not None
            else "n/a"
        ),
        "contract": contract_summary(table.contract, table.bundle.meta),
        "coverage": coverage_summary(table),
        "example": example,
        "components": list(table.components),
        "points_rows": len(charts["points"]["data"][0]["x"]),
    }


def _int(raw: Any) -> int | None:
    try:
        return int(str(raw).strip())
    except (TypeError, ValueError):
        return None


class FieldError(ValueError):
    """A form field the playground cannot read; ``field`` names it for the page."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


def load_fields(raw_loads: Any, raw_cost: Any) -> dict[str, Any]:
    """The playground's optional load description (issue 18) as a lookup query's keys.

    ``loads``: empty (balanced, the table's own answer), ``balanced``, ``uniform``,
    ``power_law(alpha)`` or a JSON list of per-expert counts. ``tile_cost_us``: empty or
    ``table`` (the table's own fitted cost, which the lookup charges when none is given) or a
    number. Whether the pair makes sense for the query is the lookup's to say
    (``moetables.lookup.queries``), as for POST /api/v1/lookup."""
    keys: dict[str, Any] = {}
    text = str(raw_loads or "").strip()
    if text.startswith("["):
        try:
            keys["loads"] = json.loads(text)
        except json.JSONDecodeError as exc:
            raise FieldError(
                "loads", f"loads: per-expert counts are not JSON ({exc.msg})"
            ) from None
    elif text:
        keys["loads"] = text
    cost = str(raw_cost or "").strip()
    if cost and cost != "table":
        try:
            keys["tile_cost_us"] = float(cost)
        except ValueError:
            raise FieldError(
                "tile_cost_us",
                f"tile_cost_us: {cost!r} is neither a number (us per row tile) nor 'table'",
            ) from None
        if not math.isfinite(keys["tile_cost_us"]):
            raise FieldError("tile_cost_us", f"tile_cost_us: {cost!r} is not a finite number")
    return keys


def _load_field(message: str) -> str | None:
    """Which load field a lookup's refusal is about: the lookup words each one's problems
    starting with the field's name (``moetables.lookup.queries.load_problem``)."""
    if "needs tile_cost_us" in message or message.startswith("tile_cost_us"):
        return "tile_cost_us"
    return "loads" if message.startswith("loads") else None


def lookup_answer(table: DeploymentTable, params: Mapping[str, Any]) -> dict[str, Any]:
    """One playground query: the time and the measured rows behind it, or why it is refused.

    With a load description the time is the lookup's own answer to the same query
    (``Deployment.answer``, as POST /api/v1/lookup gives it), beside the balanced one."""
    component = str(params.get("component") or EXPERTS)
    mode = _mode(table, params.get("mode"))
    # A mode or component the form never offers is the request's mistake (400), named with
    # the allowed values, never answered from another mode or refused in a lookup's words.
    problems = [p for p in (mode_problem(table, params.get("mode")),) if p]
    components = [str(c) for c in table.components]
    if component not in components:
        problems.append(
            f"component: this table has no component {component!r}; allowed are "
            + ", ".join(components)
        )
    if problems:
        return {
            "component": component,
            "mode": mode,
            "query": (None, None, None),
            "error": "invalid",
            "message": "; ".join(problems),
            "status": 400,
        }
    n, a, m = (
        _int(params.get("tokens")),
        _int(params.get("activated_experts")),
        _int(params.get("local_assignments")),
    )
    context: dict[str, Any] = {"component": component, "mode": mode, "query": (n, a, m)}
    if n is None or (component == EXPERTS and (a is None or m is None)):
        return {**context, "error": "invalid", "message": "give whole numbers for N, A and M"}
    try:
        keys = load_fields(params.get("loads"), params.get("tile_cost_us"))
    except FieldError as exc:
        return {**context, "error": "invalid", "field": exc.field, "message": str(exc)}
    context["loads"] = keys.get("loads")
    try:
        loaded = load_deployment(table)
        if keys:
            query = {
                "component": component,
                "mode": mode,
                "tokens": n,
                **({} if component != EXPERTS else {"activated_experts": a}),
                **({} if component != EXPERTS else {"local_assignments": m}),
                **keys,
            }
            (answer,) = loaded.lookups.answer([query])
            if "error" in answer:
                return {**context, **answer, "field": _load_field(answer["message"])}
            context["loaded_time_us"] = answer["time_us"]
        if component == EXPERTS:
            assert a is not None and m is not None
            found = explain_expert(loaded.lookups, loaded.rows, n, a, m, mode)
            return {
                **context,
                "time_us": found.time_us,
                "vertices": found.vertices,
                "rule": found.rule,
            }
        return {
            **context,
            "time_us": loaded.lookups.time_us(component, n, mode=mode),
            "vertices": (),
            "rule": "linear interpolation over the component's own rows",
        }
    except QueryError as exc:
        return {**context, "error": "invalid", "message": str(exc)}
    except CoverageError as exc:
        return {**context, "error": "out_of_support", "message": str(exc)}


def table_label(table: DeploymentTable) -> str:
    b = table.bundle
    # The backend tells apart same-name bundles of one deployment (vllm-live vs vllm-modular).
    backend = f" {table.backend}" if table.backend else ""
    return f"#{b.pk} {b.hardware} {b.model} {b.variant}{backend} · {table}"


def compare_context(
    raw_a: str | None, raw_b: str | None, raw_also: list[str] | None = None
) -> dict[str, Any]:
    """Two tables (a, b) and any more (``also``) overlaid; a given id that names no table is a
    404, never another table. With no ids at all, two defaults are chosen."""
    tables = list(
        DeploymentTable.objects.select_related("bundle")
        .only(
            "id",
            "tp",
            "dp",
            "ep",
            "rank",
            "sequence_parallel",
            "backend",
            "bundle__id",
            "bundle__hardware",
            "bundle__model",
            "bundle__variant",
        )
        .order_by("-bundle__published_at", "bundle_id", "tp", "dp", "rank")[:500]
    )
    options = [(t.pk, table_label(t)) for t in tables]
    ids = [t.pk for t in tables]
    given = [raw for raw in (raw_a, raw_b, *(raw_also or [])) if raw not in (None, "")]
    parsed = [_int(raw) for raw in given]
    # An id no primary key can hold names no table (and the database cannot take it).
    wanted = [pk for pk in parsed if pk is not None and 0 < pk < 2**63]
    if len(wanted) != len(parsed) or (
        wanted and DeploymentTable.objects.filter(pk__in=wanted).count() != len(set(wanted))
    ):
        raise Http404("no such table")
    a, b = _int(raw_a), _int(raw_b)
    if a is None:
        a = ids[0] if ids else None
    if b is None:
        # Default: another bundle's table if there is one, else the next rank of the same bundle.
        first = next((t for t in tables if t.pk == a), None)
        other = [t.pk for t in tables if first and t.bundle_id != first.bundle_id]
        b = other[0] if other else next((i for i in ids if i != a), a)
    also = [pk for pk in (_int(r) for r in raw_also or []) if pk is not None]
    context: dict[str, Any] = {"options": options, "a": a, "b": b, "also": also, "charts": {}}
    if a is None or b is None:
        return context
    chosen = [DeploymentTable.objects.select_related("bundle").get(pk=pk) for pk in (a, b, *also)]
    loaded = [load_deployment(t) for t in chosen]
    names = [table_label(t) for t in chosen]
    found, disjoint = figures.compare_figures(
        *[(name, lt.lookups, lt.rows) for name, lt in zip(names, loaded, strict=True)]
    )
    context.update(
        first=chosen[0],
        second=chosen[1],
        names=names,
        chosen=list(zip(chosen, names, strict=True)),
        disjoint=disjoint,
        charts={f"compare{i}": fig for i, fig in enumerate(found)},
    )
    return context


__all__ = [
    "FILTER_KEYS",
    "bundle_summary",
    "compare_context",
    "filter_choices",
    "filter_problems",
    "load_fields",
    "lookup_answer",
    "mode_problem",
    "recent_jobs",
    "table_context",
]
