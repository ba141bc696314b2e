"""Plotly figure specifications (plain dicts, rendered by the vendored plotly.js) from stored rows.

Figures are built from the table's own rows and from the same lookups the REST API answers;
nothing is fitted or extrapolated: a grid cell the lookup refuses stays blank (NaN -> null).
The plotly Python package is not used here: building dicts directly keeps a page well inside
its 200 ms budget.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from moetables.bundle import EXPERTS, ComponentTable
from moetables.geometry import ExpertGeometry, balanced_local_assignments
from moetables.lookup.codes import INVALID, OK
from moetables.lookup.tables import DeploymentTables

__all__ = [
    "ExpertSlice",
    "compare_figures",
    "conservation_figure",
    "expert_points_figure",
    "expert_slice_figure",
    "expert_slices",
    "local_curves_figure",
    "stability",
    "stability_figures",
]

TIME = "time (µs)"
N_AXIS = "N: rows into the expert kernel (tokens)"
A_AXIS = "A: active local experts"
M_AXIS = "M: local token-expert pairs"
MAX_GRID_TOKENS = 96
FONT = {"family": "system-ui, sans-serif", "size": 13}


def _layout(title: str, **extra: Any) -> dict[str, Any]:
    return {
        "title": {"text": title},
        "font": FONT,
        "margin": {"l": 70, "r": 20, "t": 50, "b": 60},
        "legend": {"orientation": "h", "y": -0.25},
        **extra,
    }


def _log(title: str, values: Any = None) -> dict[str, Any]:
    """A log axis; over a decade or more of ``values``, labels at the decades only (the "2"
    and "5" between them clutter a dense axis) with unlabelled minor ticks between."""
    axis: dict[str, Any] = {"title": {"text": title}, "type": "log"}
    if values is not None:
        data = [float(v) for v in np.ravel(np.asarray(values, dtype=float)) if v > 0]
        if data and max(data) >= 10 * min(data):
            axis.update(dtick=1, minor={"ticks": "outside", "ticklen": 3, "showgrid": False})
    return axis


def _nulls(values: npt.NDArray[np.float64]) -> list[float | None]:
    return [None if not math.isfinite(v) else round(float(v), 4) for v in values.tolist()]


def _expert_rows(rows: ComponentTable, mode: str) -> tuple[npt.NDArray[Any], ...]:
    sel = rows.select(EXPERTS, mode)
    return (
        rows.tokens[sel],
        rows.activated_experts[sel],
        rows.local_assignments[sel],
        rows.time_us[sel],
    )


@dataclass(frozen=True, slots=True)
class ExpertSlice:
    """Which M the heat map holds: one measured M, or the balanced total M(N) of old tables."""

    label: str
    pairs: int | None  # None: balanced M = ceil(N*k*L/E) per column


def expert_slices(
    rows: ComponentTable, geometry: ExpertGeometry, layout: str, mode: str = "eager"
) -> list[ExpertSlice]:
    if layout == "historical":
        return [ExpertSlice("balanced M = ceil(N·k·L/E)", None)]
    _, active, pairs, _ = _expert_rows(rows, mode)
    values = sorted({int(m) for m in pairs[active > 0]})
    return [ExpertSlice(f"M = {m}", m) for m in values]


def _token_grid(tokens: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    grid = np.unique(tokens[tokens >= 1])
    if grid.size > MAX_GRID_TOKENS:
        picks = np.unique(np.round(np.geomspace(1, grid.size, MAX_GRID_TOKENS)).astype(int) - 1)
        grid = grid[picks]
    return grid


def expert_slice_figure(
    lookups: DeploymentTables,
    rows: ComponentTable,
    geometry: ExpertGeometry,
    chosen: ExpertSlice,
    mode: str = "eager",
) -> dict[str, Any]:
    """Heat map of looked-up time over N and A at one M slice, with the feasible band outlined.

    Cells the lookup refuses (outside measured support) stay blank; the two lines bound the
    feasible A at each N for this M, so blank cells inside them are unmeasured, not impossible.
    """
    tokens, active, pairs, _ = _expert_rows(rows, mode)
    positive = active > 0
    ns = _token_grid(tokens[positive])
    if chosen.pairs is not None:
        # The grid thins a table of many N (the kernel-step tables: > MAX_GRID_TOKENS); the N
        # measured at this M always stay in it, or a slice of one N (TP1: M = 8N) is blank.
        ns = np.union1d(ns, tokens[positive & (pairs == chosen.pairs)])
    avals = np.arange(1, geometry.local_experts + 1, dtype=np.int64)
    nn, aa = np.meshgrid(ns, avals)
    if chosen.pairs is None:
        mcol = np.array(
            [
                balanced_local_assignments(
                    int(n), geometry.top_k, geometry.local_experts, geometry.global_experts
                )
                for n in ns
            ],
            dtype=np.int64,
        )
        mm = np.broadcast_to(mcol, nn.shape)
    else:
        mcol = np.full(ns.shape, chosen.pairs, dtype=np.int64)
        mm = np.full(nn.shape, chosen.pairs, dtype=np.int64)
    result = lookups.batch(EXPERTS, nn.ravel(), aa.ravel(), np.ascontiguousarray(mm).ravel(), mode)
    z = np.where(result.code == OK, result.time_us, np.nan).reshape(nn.shape)
    low: list[float | None] = []
    high: list[float | None] = []
    surplus = max(0, geometry.top_k - geometry.remote_experts)
    for n, m in zip(ns.tolist(), mcol.tolist(), strict=True):
        feasible = n * min(geometry.top_k, geometry.local_experts) >= m and m >= n * surplus
        lo = max(1, -(-m // n))
        hi = min(geometry.local_experts, m)
        ok = feasible and lo <= hi
        low.append(lo if ok else None)
        high.append(hi if ok else None)
    xs = ns.tolist()
    measured = int(np.isfinite(z).sum())
    traces: list[dict[str, Any]] = [
        {
            "type": "heatmap",
            "x": xs,
            "y": avals.tolist(),
            "z": [_nulls(r) for r in z],
            "colorscale": "Viridis",
            "colorbar": {"title": {"text": TIME}},
            "hoverongaps": False,
            "name": "interpolated time",
            "hovertemplate": "N=%{x}<br>A=%{y}<br>%{z:.2f} µs<extra></extra>",
        },
        {
            "type": "scatter",
            "mode": "lines",
            "x": xs,
            "y": low,
            "name": "feasible A, lower bound",
            "line": {"color": "#d62728", "dash": "dash"},
        },
        {
            "type": "scatter",
            "mode": "lines",
            "x": xs,
            "y": high,
            "name": "feasible A, upper bound",
            "line": {"color": "#ff7f0e", "dash": "dot"},
        },
    ]
    title = f"Expert time over N and A, {chosen.label} ({mode}); blank = outside measured support"
    # The x axis spans the N columns that hold data at this M (half a column either side), not
    # every N of the table: a slice of one large M is otherwise a thin stripe at one edge.
    filled = ns[np.isfinite(z).any(axis=0)] if z.size else ns
    xaxis = _log(N_AXIS, filled if filled.size else ns)
    if filled.size:
        left, right = math.log10(float(filled.min())), math.log10(float(filled.max()))
        pad = max(0.15, (right - left) * 0.04)
        xaxis["range"] = [left - pad, right + pad]
    layout = _layout(
        title,
        xaxis=xaxis,
        yaxis={"title": {"text": A_AXIS}},
        meta={"cells_with_data": measured, "link": "tokens"},
    )
    return {"data": traces, "layout": layout}


def expert_points_figure(rows: ComponentTable, mode: str = "eager") -> dict[str, Any]:
    """Every measured expert row as a 3-D scatter: N, A and time, coloured by M."""
    tokens, active, pairs, times = _expert_rows(rows, mode)
    # M spans 0 to N*k: on a linear scale nearly every point gets the darkest colour, so the
    # colour is log10(M+1), with the colour bar labelled in M itself.
    shade = np.log10(pairs.astype(float) + 1.0)
    top = float(shade.max()) if shade.size else 1.0
    ticks = [t for t in range(int(top) + 1)]
    trace = {
        "type": "scatter3d",
        "mode": "markers",
        "x": tokens.tolist(),
        "y": active.tolist(),
        "z": [round(float(t), 4) for t in times],
        "customdata": pairs.tolist(),
        "marker": {
            "size": 3,
            "color": [round(float(v), 4) for v in shade],
            "colorscale": "Viridis",
            "colorbar": {
                "title": {"text": "M (pairs)"},
                "tickvals": ticks,
                "ticktext": [str(10**t - 1 if t == 0 else 10**t) for t in ticks],
            },
        },
        "name": "measured rows",
        "hovertemplate": "N=%{x}<br>A=%{y}<br>M=%{customdata}<br>%{z:.2f} µs<extra></extra>",
    }

    def axis3d(title: str, values: Any) -> dict[str, Any]:
        axis = _log(title, values)
        axis.pop("minor", None)  # 3-D scenes have no minor ticks
        return axis

    scene = {
        "xaxis": axis3d("N (tokens)", tokens),
        "yaxis": {"title": {"text": "A (experts)"}},
        "zaxis": axis3d(TIME, times),
    }
    return {"data": [trace], "layout": _layout(f"Measured expert rows ({mode})", scene=scene)}


def local_curves_figure(rows: ComponentTable) -> dict[str, Any]:
    """Each local component and mode as a line over its own row count, log-log."""
    traces: list[dict[str, Any]] = []
    for component in sorted(set(rows.component.tolist())):
        for mode in sorted(set(rows.mode.tolist())):
            sel = rows.select(component, mode)
            if component == EXPERTS:
                sel &= (rows.activated_experts == 0) & (rows.local_assignments == 0)
                name = f"experts all-remote A=M=0 / {mode}"
            else:
                name = f"{component} / {mode}"
            if not sel.any():
                continue
            order = np.argsort(rows.tokens[sel], kind="stable")
            traces.append(
                {
                    "type": "scatter",
                    "mode": "lines+markers",
                    "marker": {"size": 4},
                    "x": rows.tokens[sel][order].tolist(),
                    "y": [round(float(t), 4) for t in rows.time_us[sel][order]],
                    "name": name,
                }
            )
    layout = _layout(
        "Local components over their own rows (log-log)",
        meta={"link": "rows"},
        xaxis=_log("rows (tokens)", rows.tokens),
        yaxis=_log(TIME, rows.time_us[rows.component != EXPERTS]),
    )
    return {"data": traces, "layout": layout}


@dataclass(frozen=True, slots=True)
class Stability:
    source: str  # "conditioning_controls" (per point) or "conditioning_summary" (compact)
    tolerance: float
    checked: int
    failed: int
    max_relative_change: float | None
    figure: dict[str, Any] | None


def stability(contract: dict[str, Any], coverage: dict[str, Any]) -> Stability:
    """Per-point B vs 2B changes where the coverage keeps them, else the compact summary."""
    conditioning = contract.get("expert_conditioning")
    tolerance = 0.03
    if isinstance(conditioning, dict):
        raw = conditioning.get("quality_relative_tolerance")
        if isinstance(raw, int | float):
            tolerance = float(raw)
    controls = coverage.get("conditioning_controls")
    if isinstance(controls, list) and controls:
        xs: list[int] = []
        ys: list[float] = []
        failed: list[bool] = []
        labels: list[str] = []
        for c in controls:
            point = c.get("point", {}) if isinstance(c, dict) else {}
            change = c.get("relative_change") if isinstance(c, dict) else None
            if not isinstance(change, int | float):
                continue
            xs.append(int(point.get("tokens", 0)))
            ys.append(abs(float(change)) * 100)
            failed.append(abs(float(change)) > tolerance or c.get("supported") is False)
            labels.append(
                f"{point.get('component')} N={point.get('tokens')} "
                f"A={point.get('activated_experts')} M={point.get('local_assignments')}"
            )
        ok = [i for i, f in enumerate(failed) if not f]
        bad = [i for i, f in enumerate(failed) if f]

        def trace(idx: list[int], name: str, color: str) -> dict[str, Any]:
            return {
                "type": "scatter",
                "mode": "markers",
                "x": [xs[i] for i in idx],
                "y": [round(ys[i], 4) for i in idx],
                "text": [labels[i] for i in idx],
                "name": name,
                "marker": {"color": color, "size": 6 if color == "#d62728" else 4},
                "hovertemplate": "%{text}<br>%{y:.2f} %<extra></extra>",
            }

        traces = [trace(ok, "within tolerance", "#1f77b4"), trace(bad, "failed", "#d62728")]
        layout = _layout(
            "Stability: relative change between the B and 2B arms, per point",
            xaxis=_log("N (tokens) of the point"),
            yaxis={"title": {"text": "|relative change| (%)"}, "rangemode": "tozero"},
            shapes=[
                {
                    "type": "line",
                    "xref": "paper",
                    "x0": 0,
                    "x1": 1,
                    "y0": tolerance * 100,
                    "y1": tolerance * 100,
                    "line": {"color": "#d62728", "dash": "dash"},
                }
            ],
            annotations=[
                {
                    "xref": "paper",
                    "x": 1,
                    "y": tolerance * 100,
                    "text": f"tolerance {tolerance:.0%}",
                    "showarrow": False,
                    "yanchor": "bottom",
                    "xanchor": "right",
                }
            ],
        )
        return Stability(
            "conditioning_controls",
            tolerance,
            len(ys),
            len(bad),
            max(ys) / 100 if ys else None,
            {"data": traces, "layout": layout},
        )
    summary = coverage.get("conditioning_summary")
    summary = summary if isinstance(summary, dict) else {}
    peak = summary.get("max_relative_change")
    return Stability(
        "conditioning_summary",
        tolerance,
        int(summary.get("checked_points") or 0),
        int(summary.get("failed_points") or 0),
        float(peak) if isinstance(peak, int | float) else None,
        None,
    )


def compare_figures(
    first: tuple[str, DeploymentTables, ComponentTable],
    *others: tuple[str, DeploymentTables, ComponentTable],
) -> tuple[list[dict[str, Any]], list[str]]:
    """Every table on the same axes, and the ratio of each other table to the first.

    Ratios are taken at the first table's measured points, looked up in the other table
    (interpolated inside its support, refused outside it): no point is invented for either.
    Returns the figures and one sentence per other table that shares no support with the first.
    """
    name_a, look_a, rows_a = first
    tables = [first, *others]
    dashes = ["solid", "dash", "dot", "dashdot", "longdash"]
    symbols = ["circle", "x", "triangle-up", "square", "diamond"]
    figures: list[dict[str, Any]] = []
    common = set(look_a.components)
    for _, look, _ in others:
        common &= set(look.components)
    local = [c for c in look_a.components if c != EXPERTS and c in common]
    modes = [m for m in look_a.modes if all(m in look.modes for _, look, _ in others)]
    overlay: list[dict[str, Any]] = []
    ratio: list[dict[str, Any]] = []
    answered: dict[str, int] = {name: 0 for name, _, _ in others}
    for component in local:
        for mode in modes:
            for index, (name, _, rows) in enumerate(tables):
                sel = rows.select(component, mode)
                order = np.argsort(rows.tokens[sel], kind="stable")
                overlay.append(
                    {
                        "type": "scatter",
                        "mode": "lines",
                        "x": rows.tokens[sel][order].tolist(),
                        "y": [round(float(t), 4) for t in rows.time_us[sel][order]],
                        "name": f"{component}/{mode}: {name}",
                        "line": {"dash": dashes[index % len(dashes)]},
                    }
                )
            sel = rows_a.select(component, mode)
            xs = np.sort(rows_a.tokens[sel])
            got_a = look_a.batch(component, xs, mode=mode)
            for name, look, _ in others:
                got_b = look.batch(component, xs, mode=mode)
                ok = (got_a.code == OK) & (got_b.code == OK)
                answered[name] += int(ok.sum())
                ratio.append(
                    {
                        "type": "scatter",
                        "mode": "lines",
                        "x": xs[ok].tolist(),
                        "y": _nulls(got_b.time_us[ok] / got_a.time_us[ok]),
                        "name": f"{component}/{mode}: {name}",
                    }
                )
    figures.append(
        {
            "data": overlay,
            "layout": _layout(
                "Local components, every table (log-log)",
                meta={"link": "rows"},
                xaxis=_log("rows (tokens)", rows_a.tokens),
                yaxis=_log(TIME),
            ),
        }
    )
    figures.append(
        {
            "data": ratio,
            "layout": _layout(
                f"Local components: each table / {name_a}",
                meta={"link": "rows"},
                xaxis=_log("rows (tokens)", rows_a.tokens),
                yaxis={"title": {"text": "time ratio (table / first)"}},
            ),
        }
    )
    expert_overlay: list[dict[str, Any]] = []
    expert_ratio: list[dict[str, Any]] = []
    for mode in modes:
        for index, (name, _, rows) in enumerate(tables):
            tokens, active, _, times = _expert_rows(rows, mode)
            expert_overlay.append(
                {
                    "type": "scattergl",
                    "mode": "markers",
                    "x": tokens.tolist(),
                    "y": [round(float(t), 4) for t in times],
                    "text": [f"A={a}" for a in active.tolist()],
                    "name": f"experts/{mode}: {name}",
                    "marker": {"size": 4, "symbol": symbols[index % len(symbols)], "opacity": 0.7},
                }
            )
        tokens, active, pairs, _ = _expert_rows(rows_a, mode)
        got_a = look_a.batch(EXPERTS, tokens, active, pairs, mode=mode)
        for name, look, _ in others:
            got_b = look.batch(EXPERTS, tokens, active, pairs, mode=mode)
            ok = (got_a.code == OK) & (got_b.code == OK)
            answered[name] += int(ok.sum())
            refused = int(((got_b.code != OK) & (got_b.code != INVALID)).sum())
            expert_ratio.append(
                {
                    "type": "scattergl",
                    "mode": "markers",
                    "x": tokens[ok].tolist(),
                    "y": _nulls(got_b.time_us[ok] / got_a.time_us[ok]),
                    "text": [
                        f"A={a} M={m}"
                        for a, m in zip(active[ok].tolist(), pairs[ok].tolist(), strict=True)
                    ],
                    "marker": {"size": 5},
                    "name": f"experts/{mode}: {name} ({refused} points outside its support)",
                }
            )
    figures.append(
        {
            "data": expert_overlay,
            "layout": _layout(
                "Expert rows, every table (log-log)",
                meta={"link": "tokens"},
                xaxis=_log(N_AXIS, rows_a.tokens),
                yaxis=_log(TIME, rows_a.time_us),
            ),
        }
    )
    figures.append(
        {
            "data": expert_ratio,
            "layout": _layout(
                f"Experts: each table / {name_a} at the first table's measured points",
                meta={"link": "tokens"},
                xaxis=_log(N_AXIS, rows_a.tokens),
                yaxis={"title": {"text": "time ratio (table / first)"}},
            ),
        }
    )
    disjoint = [
        f"{name} shares no measured support with {name_a}: none of the first table's points "
        "lies inside its support (or they share no component and mode), so there is no ratio "
        "to draw; nothing is extrapolated"
        for name, count in answered.items()
        if count == 0
    ]
    return figures, disjoint


_OK = "#1f77b4"
_BAD = "#d62728"
_RETRIED = "#ff7f0e"


def _band(tolerance: float) -> list[dict[str, Any]]:
    return [
        {
            "type": "line",
            "xref": "paper",
            "x0": 0,
            "x1": 1,
            "y0": tolerance * 100,
            "y1": tolerance * 100,
            "line": {"color": _BAD, "dash": "dash"},
        }
    ]


def _band_note(tolerance: float) -> list[dict[str, Any]]:
    return [
        {
            "xref": "paper",
            "x": 1,
            "y": tolerance * 100,
            "text": f"tolerance {tolerance:.0%}",
            "showarrow": False,
            "yanchor": "bottom",
            "xanchor": "right",
        }
    ]


def _point_label(p: dict[str, Any]) -> str:
    b = "n/a" if p["b_median_us"] is None else f"{p['b_median_us']:.2f}"
    b2 = "n/a" if p["b2_median_us"] is None else f"{p['b2_median_us']:.2f}"
    verdict = "passed" if p["passed"] else "FAILED"
    published = ", published" if p["published"] else ""
    return (
        f"N={p['tokens']} A={p['activated_experts']} M={p['local_assignments']}<br>"
        f"attempt {p['attempt']} ({verdict}{published})<br>B {b} µs · 2B {b2} µs"
    )


def _groups(
    points: list[dict[str, Any]], retried: set[tuple[int, int, int]]
) -> list[tuple[str, str, str, list[dict[str, Any]]]]:
    """Passed first attempts, retried points' passing attempts, failed attempts."""

    def key(p: dict[str, Any]) -> tuple[int, int, int]:
        return (p["tokens"], p["activated_experts"], p["local_assignments"])

    return [
        ("passed", _OK, "circle", [p for p in points if p["passed"] and key(p) not in retried]),
        (
            "passed after a retry",
            _RETRIED,
            "diamond",
            [p for p in points if p["passed"] and key(p) in retried],
        ),
        ("failed attempt", _BAD, "x", [p for p in points if not p["passed"]]),
    ]


def stability_figures(payload: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """B against 2B with the tolerance band, and the relative change over N and over A.

    Every control is drawn, failed and retried attempts marked; nothing is drawn for a table
    whose bundle publishes no per-point evidence (the page says why instead).
    """
    points = payload["points"]
    if not points:
        return {}
    tolerance = float(payload["quality"]["tolerance"])
    retried = {
        (p["tokens"], p["activated_experts"], p["local_assignments"])
        for p in points
        if p["attempt"] > 0
    }
    groups = _groups(points, retried)
    figures: dict[str, dict[str, Any]] = {}
    pairs = [p for p in points if p["b_median_us"] and p["b2_median_us"]]
    if pairs:
        low = min(min(p["b_median_us"], p["b2_median_us"]) for p in pairs) * 0.9
        high = max(max(p["b_median_us"], p["b2_median_us"]) for p in pairs) * 1.1
        line = [low, high]
        traces: list[dict[str, Any]] = [
            {
                "type": "scatter",
                "mode": "lines",
                "x": line,
                "y": line,
                "name": "2B = B",
                "line": {"color": "#7f7f7f", "width": 1},
                "hoverinfo": "skip",
            },
            {
                "type": "scatter",
                "mode": "lines",
                "x": line,
                "y": [v * (1 + tolerance) for v in line],
                "name": f"+{tolerance:.0%} band",
                "line": {"color": _BAD, "dash": "dash", "width": 1},
                "hoverinfo": "skip",
            },
            {
                "type": "scatter",
                "mode": "lines",
                "x": line,
                "y": [v * (1 - tolerance) for v in line],
                "name": f"−{tolerance:.0%} band",
                "line": {"color": _BAD, "dash": "dash", "width": 1},
                "hoverinfo": "skip",
                "showlegend": False,
            },
        ]
        for name, color, symbol, group in groups:
            group = [p for p in group if p in pairs]
            if group:
                traces.append(
                    {
                        "type": "scatter",
                        "mode": "markers",
                        "name": name,
                        "x": [p["b_median_us"] for p in group],
                        "y": [p["b2_median_us"] for p in group],
                        "text": [_point_label(p) for p in group],
                        "marker": {
                            "color": color,
                            "symbol": symbol,
                            "size": 6 if symbol != "circle" else 5,
                            "opacity": 0.8,
                        },
                        "hovertemplate": "%{text}<extra></extra>",
                    }
                )
        figures["stability_b2b"] = {
            "data": traces,
            "layout": _layout(
                f"Stability: 2B median against B median per control ({tolerance:.0%} band)",
                xaxis=_log("B arm median (µs)", line),
                yaxis=_log("2B arm median (µs): the published value", line),
                hovermode="closest",
            ),
        }
    for axis, key, title, log in (
        ("n", "tokens", N_AXIS, True),
        ("a", "activated_experts", A_AXIS, False),
    ):
        traces = []
        for name, color, symbol, group in groups:
            if group:
                traces.append(
                    {
                        "type": "scatter",
                        "mode": "markers",
                        "name": name,
                        "x": [p[key] for p in group],
                        "y": [round(p["relative_change"] * 100, 4) for p in group],
                        "text": [_point_label(p) for p in group],
                        "marker": {"color": color, "symbol": symbol, "size": 6, "opacity": 0.8},
                        "hovertemplate": "%{text}<br>%{y:.2f} %<extra></extra>",
                    }
                )
        figures[f"stability_{axis}"] = {
            "data": traces,
            "layout": _layout(
                f"Stability: relative change |2B − B| / B over {key.replace('_', ' ')}",
                xaxis=_log(title, [p[key] for p in points]) if log else {"title": {"text": title}},
                yaxis={"title": {"text": "relative change (%)"}, "rangemode": "tozero"},
                shapes=_band(tolerance),
                annotations=_band_note(tolerance),
                meta={"link": "tokens"} if log else {},
            ),
        }
    return figures


_PART_COLORS = {
    "gate_routing": "#1f77b4",
    "experts": "#2ca02c",
    "finalize_copy": "#9467bd",
    "wrapper": "#8c564b",
    "outside_scopes": "#d62728",
}


def conservation_figure(payload: dict[str, Any]) -> dict[str, Any] | None:
    """Stacked component sums (and what fell outside the scopes) against each traced native
    forward's whole CUDA activity."""
    forwards = payload["forwards"]
    if not forwards:
        return None
    labels = [f"N={f['tokens']} (forward {f['forward']})" for f in forwards]
    names = [
        c
        for c in _PART_COLORS
        if c != "outside_scopes" and any(c in f["components_us"] for f in forwards)
    ]
    traces: list[dict[str, Any]] = []
    for name in names:
        traces.append(
            {
                "type": "bar",
                "name": name,
                "x": labels,
                "y": [f["components_us"].get(name, 0.0) for f in forwards],
                "marker": {"color": _PART_COLORS[name]},
                "hovertemplate": f"{name}: %{{y:.3f}} µs<extra></extra>",
            }
        )
    traces.append(
        {
            "type": "bar",
            "name": "outside every scope",
            "x": labels,
            "y": [f["outside_scopes_us"] for f in forwards],
            "marker": {"color": _PART_COLORS["outside_scopes"]},
            "hovertemplate": "outside: %{y:.3f} µs<extra></extra>",
        }
    )
    traces.append(
        {
            "type": "scatter",
            "mode": "markers",
            "name": "native forward total",
            "x": labels,
            "y": [f["native_total_us"] for f in forwards],
            "marker": {"symbol": "line-ew-open", "size": 28, "color": "#000", "line": {"width": 3}},
            "hovertemplate": "whole forward: %{y:.3f} µs<extra></extra>",
        }
    )
    return {
        "data": traces,
        "layout": _layout(
            "Conservation: components stacked against each traced native forward",
            barmode="stack",
            xaxis={"title": {"text": "traced native forward"}},
            yaxis={"title": {"text": "CUDA activity (µs)"}, "rangemode": "tozero"},
            hovermode="x unified",
        ),
    }
