"""The dashboard's estimate page: a step's token counts and a policy in, the per-rank timeline
(compute, wait, transfer) and the numbers out. The same request and answer as
POST /api/v1/estimate (`moetables.estimate_query`), drawn with Plotly."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from django.shortcuts import get_object_or_404, render

from moetables.comm import ClusterError
from moetables.errors import BundleError, CoverageError, QueryError
from moetables.estimate import MODES, TILE_COST_WORDS
from moetables.estimate_query import answer_estimate, parse_estimate_request
from moetables.routing import POLICIES
from registry.bundles.models import Bundle
from registry.lookup.services import BundleRef, tables_for
from registry.profile_models import RoutingProfileRecord
from registry.services.estimate import cluster_dir, named_cluster
from registry.services.profiles import published_profile

if TYPE_CHECKING:
    from django.http import HttpRequest, HttpResponse

__all__ = ["choice_problems", "estimate_page", "tile_cost_field", "timeline_figure"]

COLORS = {"compute": "#2b6cb0", "wait": "#d69e2e", "transfer": "#c53030"}


def timeline_figure(answer: dict[str, Any]) -> dict[str, Any]:
    """Horizontal bars per rank: compute segments, then each collective's wait and transfer."""
    bars: dict[str, dict[str, list[Any]]] = {
        kind: {"y": [], "base": [], "x": [], "text": []} for kind in COLORS
    }

    def add(kind: str, rank: int, start: float, length: float, text: str) -> None:
        if length <= 0:
            return
        bar = bars[kind]
        bar["y"].append(f"rank {rank}")
        bar["base"].append(round(start, 4))
        bar["x"].append(round(length, 4))
        bar["text"].append(text)

    for e in answer["events"]:
        if e["kind"] == "compute":
            add(
                "compute",
                e["rank"],
                e["start_us"],
                e["end_us"] - e["start_us"],
                f"{e['name']}: {e['end_us'] - e['start_us']:.2f} µs",
            )
            continue
        add(
            "wait",
            e["rank"],
            e["start_us"],
            e["wait_us"],
            f"{e['name']}: wait {e['wait_us']:.2f} µs",
        )
        if e["transfer_us"] is not None:
            add(
                "transfer",
                e["rank"],
                e["start_us"] + e["wait_us"],
                e["transfer_us"],
                f"{e['name']}: transfer {e['transfer_us']:.2f} µs, {e['bytes']} bytes sent",
            )
    data = [
        {
            "type": "bar",
            "orientation": "h",
            "name": kind,
            "marker": {"color": COLORS[kind]},
            "hovertemplate": "%{text}<extra>%{y}</extra>",
            "textposition": "none",
            **bar,
        }
        for kind, bar in bars.items()
        if bar["x"]
    ]
    title = "Per-rank timeline of one MoE layer"
    if answer["layer_us"] is None:
        title += " (no cluster: transfers unknown, left out)"
    return {
        "data": data,
        "layout": {
            "title": {"text": title},
            "font": {"family": "system-ui, sans-serif", "size": 13},
            "barmode": "overlay",
            "xaxis": {"title": {"text": "µs from the layer's start"}},
            "yaxis": {"autorange": "reversed"},
            "margin": {"l": 70, "r": 20, "t": 50, "b": 60},
            "legend": {"orientation": "h", "y": -0.25},
            "height": max(420, 160 + 50 * len(answer["ranks"])),
        },
    }


class _NoDeployment(Exception):
    """The form names a deployment (TP/DP/SP) the bundle has no table for."""


def _deployments(bundle: Bundle) -> list[tuple[int, int, bool]]:
    seen = {(t.tp, t.dp, t.sequence_parallel) for t in bundle.tables.all()}
    return sorted(seen)


def _holds(name: str, ranks: int) -> bool:
    """Whether the named cluster puts ranks 0..ranks-1 in its groups (unreadable: no)."""
    try:
        return set(range(ranks)) <= named_cluster(name).ranks()
    except (QueryError, ClusterError):
        return False


def _value(d: tuple[int, int, bool]) -> str:
    return f"{d[0]}/{d[1]}/{int(d[2])}"


def _json_field(text: str, what: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise QueryError(f"{what}: not JSON ({exc.msg})") from None


def _whole(text: str, what: str) -> int:
    """A form's whole number, refused naming the field (not Python's int() message)."""
    try:
        return int(text)
    except ValueError:
        raise QueryError(f"{what}: {text!r} is not a whole number") from None


def tile_cost_field(text: str) -> float | str:
    """The form's ``tile_cost_us`` (issue 18) as the API takes it: ``"auto"``, ``"table"``,
    ``"none"`` or a number; whether the number may be used is the request parser's to say."""
    text = text.strip()
    if text in TILE_COST_WORDS:
        return text
    try:
        return float(text)
    except ValueError:
        raise QueryError(
            f"tile_cost_us: {text!r} is neither a number (us per row tile) nor one of "
            f"{list(TILE_COST_WORDS)}"
        ) from None


def choice_problems(params: Any) -> list[str]:
    """A ``policy`` or ``mode`` the page has no menu entry for, named with the allowed ones.

    The menus cannot show such a value: they fell back to their first entry while the request
    asked for another (and with token counts the estimate refused it in the parser's words);
    now the page says what was asked and what is allowed, before anything else."""
    problems = []
    for key, allowed in (("policy", POLICIES), ("mode", MODES)):
        value = params.get(key)
        if value is not None and value not in allowed:
            problems.append(f"{key}: unknown {key} {value!r}; allowed are {', '.join(allowed)}")
    return problems


def estimate_page(request: HttpRequest, pk: int) -> HttpResponse:
    bundle = get_object_or_404(Bundle, pk=pk)
    deployments = _deployments(bundle)
    params = request.GET
    clusters = (
        sorted(p.stem for p in cluster_dir().glob("*.yaml")) if cluster_dir().is_dir() else []
    )
    default = next((d for d in deployments if d[1] > 1), deployments[0] if deployments else None)
    chosen = params.get("deployment") or (_value(default) if default else "")
    # Preselect a cluster only where it holds every rank of the default deployment (the
    # shipped one is a two-GPU host: on a DP4 bundle it would refuse the first estimate).
    ranks = default[0] * default[1] if default else 1
    fitting = [c for c in clusters if _holds(c, ranks)]
    form = {
        "deployment": chosen,
        "tokens": params.get("tokens", ",".join(["64"] * (default[1] if default else 1))),
        "policy": params.get("policy", "balanced"),
        "seed": params.get("seed", "0"),
        "mode": params.get("mode", "eager"),
        "cluster": params.get("cluster", fitting[0] if fitting else ""),
        "expert_counts": params.get("expert_counts", ""),
        "active_curve": params.get("active_curve", ""),
        "load_shares": params.get("load_shares", ""),
        "profile": params.get("profile", ""),
        "layer": params.get("layer", ""),
        "profile_draw": params.get("profile_draw", "sample"),
        "tile_cost_us": params.get("tile_cost_us", ""),
    }
    context: dict[str, Any] = {
        "bundle": bundle,
        "deployments": [
            {"value": _value(d), "label": f"TP{d[0]} · DP{d[1]}" + (" · SP" if d[2] else "")}
            for d in deployments
        ],
        "policies": POLICIES,
        "profiles": RoutingProfileRecord.objects.order_by("-published_at", "-id").values(
            "pk", "model", "router", "global_experts", "top_k"
        )[:100],
        "clusters": clusters,
        "form": form,
        "answer": None,
        "error": None,
        "charts": {},
    }
    if problems := choice_problems(params):
        # The form shows the defaults; the message names the value that was not used.
        form["policy"] = form["policy"] if form["policy"] in POLICIES else "balanced"
        form["mode"] = form["mode"] if form["mode"] in MODES else "eager"
        context["error"] = ("invalid", "; ".join(problems))
        return render(request, "frontend/estimate.html", context, status=400)
    if "tokens" in params:
        try:
            parts = form["deployment"].split("/")
            if len(parts) != 3:
                raise QueryError(f"deployment: {form['deployment']!r} is not TP/DP/SP")
            tp, dp, sp = (_whole(v, "deployment") for v in parts)
            if (tp, dp, bool(sp)) not in deployments:
                # Before the token counts: their count follows the deployment, so naming it
                # wrong would otherwise read as a token-count mistake.
                raise _NoDeployment(
                    f"no such deployment TP{tp} · DP{dp}{' · SP' if sp else ''} in this bundle; "
                    "it has " + ", ".join(c["label"] for c in context["deployments"])
                )
            raw: dict[str, Any] = {
                "tp": tp,
                "dp": dp,
                "sequence_parallel": bool(sp),
                "tokens": [
                    _whole(n, "tokens per DP rank")
                    for n in form["tokens"].replace(" ", "").split(",")
                    if n
                ],
                "policy": form["policy"],
                "seed": _whole(form["seed"] or "0", "seed"),
                "mode": form["mode"],
            }
            for key in ("expert_counts", "active_curve", "load_shares"):
                if form[key].strip():
                    raw[key] = _json_field(form[key], key)
            if form["profile"].strip():
                if not form["profile"].strip().isdigit():
                    raise QueryError(f"profile: {form['profile']!r} is not a profile id")
                found = published_profile(int(form["profile"]))
                if isinstance(found, str):
                    raise QueryError(found)
                raw["profile"] = found
            if form["layer"].strip():
                if not form["layer"].strip().isdigit():
                    raise QueryError(f"layer: {form['layer']!r} is not a layer index")
                raw["layer"] = int(form["layer"])
            if form["profile_draw"] != "sample":
                # The parser names an unknown draw, or a draw without the captured policy.
                raw["profile_draw"] = form["profile_draw"]
            if form["tile_cost_us"].strip():
                raw["tile_cost_us"] = tile_cost_field(form["tile_cost_us"])
            cluster = named_cluster(form["cluster"]) if form["cluster"] else None
            answer = answer_estimate(
                tables_for(BundleRef(bundle.pk, bundle.sha256)),
                parse_estimate_request(raw),
                cluster,
            )
            assert isinstance(answer, dict)
            context["answer"] = answer
            context["charts"] = {"timeline": timeline_figure(answer)}
        except _NoDeployment as exc:
            context["error"] = ("no_deployment", str(exc))
        except ValueError as exc:  # QueryError, ClusterError, a bad number: the input
            context["error"] = ("invalid", str(exc))
        except CoverageError as exc:
            context["error"] = ("out_of_support", str(exc))
        except BundleError as exc:
            context["error"] = ("corrupt_bundle", str(exc))
    return render(request, "frontend/estimate.html", context)
