"""The dashboard's routing profiles: a list, and a page per profile with the per-layer expert
load (heatmap), the load imbalance per layer, and for a chosen EP size the per-rank A(N) and
M(N) of the captured steps against the ``balanced`` policy's (Plotly, drawn by figures.js)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
from django.shortcuts import get_object_or_404, render

from moetables.profiles import ProfileError, RoutingProfile
from moetables.routing import Deployment, route_batch
from registry.permissions import can_delete_routing_profile
from registry.profile_models import RoutingProfileRecord
from registry.services.profiles import load_profile

if TYPE_CHECKING:
    from django.http import HttpRequest, HttpResponse

__all__ = ["n_groups", "profile_detail", "profile_figures", "profile_list"]

RANK_COLORS = (
    "#2b6cb0",
    "#c53030",
    "#2f855a",
    "#d69e2e",
    "#6b46c1",
    "#dd6b20",
    "#319795",
    "#b83280",
)


def profile_list(request: HttpRequest) -> HttpResponse:
    profiles = RoutingProfileRecord.objects.select_related("published_by")[:200]
    return render(request, "frontend/profiles.html", {"profiles": profiles})


def _curves(profile: RoutingProfile, ep: int, layer: int | None) -> dict[str, Any]:
    """Per rank, the mean A and M of the captured steps at each N; the busiest rank's (the
    largest per step, then the mean); and balanced's."""
    stats = profile.rank_statistics(ep, layer)
    group, ns = n_groups(stats.tokens)
    figs: dict[str, Any] = {}
    deployment = Deployment(1, ep, False, profile.global_experts, profile.top_k)
    # balanced at the same N: DP counts that gather to N (R2: N is the sum over DP ranks).
    kept = ns[ns >= ep]
    steps = [[int(n) - (ep - 1)] + [1] * (ep - 1) for n in kept]
    balanced = route_batch(deployment, steps, "balanced") if steps else None
    for key, values, label in (
        ("a_curve", stats.activated_experts, "active local experts A"),
        ("m_curve", stats.local_assignments, "local pairs M"),
    ):
        data: list[dict[str, Any]] = []
        for rank in range(ep):
            sums = np.bincount(group, weights=values[:, rank], minlength=ns.size)
            mean = (sums / np.bincount(group, minlength=ns.size)).tolist()
            data.append(
                {
                    "type": "scatter",
                    "mode": "lines+markers",
                    "name": f"rank {rank} captured",
                    "x": ns.tolist(),
                    "y": [round(v, 3) for v in mean],
                    "line": {"color": RANK_COLORS[rank % len(RANK_COLORS)]},
                }
            )
        if ep > 1:
            # The rank the layer waits for, taken per step and layer before averaging: with all
            # layers the per-rank means flatten skew whose hot experts move between layers.
            sums = np.bincount(group, weights=values.max(axis=1), minlength=ns.size)
            busiest = sums / np.bincount(group, minlength=ns.size)
            data.append(
                {
                    "type": "scatter",
                    "mode": "lines",
                    "name": "busiest rank",
                    "x": ns.tolist(),
                    "y": [round(v, 3) for v in busiest.tolist()],
                    "line": {"dash": "dot", "color": "#1a202c", "width": 3},
                }
            )
        if balanced is not None:
            column = balanced.activated_experts if key == "a_curve" else balanced.local_assignments
            for rank in range(min(ep, 2) if ep > 1 else 1):
                data.append(
                    {
                        "type": "scatter",
                        "mode": "lines",
                        "name": f"rank {rank} balanced",
                        "x": kept.tolist(),
                        "y": column[:, rank].tolist(),
                        "line": {"dash": "dash", "color": "#718096"},
                    }
                )
        figs[key] = {
            "data": data,
            "layout": {
                "title": {"text": f"{label} per rank at EP{ep} over N (mean of captured steps)"},
                "xaxis": {"title": {"text": "N (rows routed in the step)"}, "type": "log"},
                "yaxis": {"title": {"text": label}},
                "height": 420,
                "meta": {"link": "profile-n"},
            },
        }
    return figs


def n_groups(tokens: Any, most: int = 60) -> tuple[Any, Any]:
    """Each step's group and the groups' N: every distinct N, or (past ``most`` of them)
    log-spaced bins labelled by their steps' mean N."""
    unique, index = np.unique(tokens, return_inverse=True)
    if unique.size <= most:
        return index, unique
    edges = np.geomspace(unique[0], unique[-1] + 1, most + 1)
    raw = np.clip(np.searchsorted(edges, tokens, side="right") - 1, 0, most - 1)
    _, group = np.unique(raw, return_inverse=True)
    means = np.bincount(group, weights=tokens) / np.bincount(group)
    return group, np.rint(means).astype(np.int64)


def profile_figures(profile: RoutingProfile, ep: int, layer: int | None) -> dict[str, Any]:
    shares = profile.totals / np.maximum(profile.totals.sum(axis=1, keepdims=True), 1)
    heat = {
        "data": [
            {
                "type": "heatmap",
                "z": np.round(shares * profile.global_experts, 4).tolist(),
                "x": list(range(profile.global_experts)),
                "y": [f"layer {i}" for i in profile.layers],
                "colorscale": "Viridis",
                "colorbar": {"title": {"text": "load / mean"}},
                "hovertemplate": "%{y}, expert %{x}: %{z:.2f} x mean<extra></extra>",
            }
        ],
        "layout": {
            "title": {"text": "Expert load per layer (pairs over all steps, 1 = the mean expert)"},
            "xaxis": {"title": {"text": "expert"}},
            "height": max(420, 120 + 22 * len(profile.layers)),
        },
    }
    imbalance = {
        "data": [
            {
                "type": "bar",
                "x": [f"layer {i}" for i in profile.layers],
                "y": np.round(profile.imbalance(), 4).tolist(),
                "marker": {"color": "#2b6cb0"},
            }
        ],
        "layout": {
            "title": {"text": "Load imbalance per layer (busiest expert / mean expert)"},
            "yaxis": {"title": {"text": "max / mean"}},
            "height": 420,
        },
    }
    return {"heatmap": heat, "imbalance": imbalance, **_curves(profile, ep, layer)}


def profile_detail(request: HttpRequest, pk: int) -> HttpResponse:
    record = get_object_or_404(RoutingProfileRecord.objects.select_related("published_by"), pk=pk)
    error = None
    charts: dict[str, Any] = {}
    eps = [e for e in (1, 2, 4, 8, 16, 32, 64) if e <= record.global_experts]
    raw_ep = request.GET.get("ep", "2")
    ep = int(raw_ep) if raw_ep.isdigit() and int(raw_ep) in eps else (2 if 2 in eps else 1)
    raw_layer = request.GET.get("layer", "")
    layer: int | None = int(raw_layer) if raw_layer.isdigit() else None
    layers: list[int] = []
    try:
        profile = load_profile(record)
        layers = profile.layers
        if layer is not None and layer not in layers:
            layer = None
        charts = profile_figures(profile, ep, layer)
    except (ProfileError, OSError) as exc:
        error = str(exc)
    return render(
        request,
        "frontend/profile.html",
        {
            "record": record,
            "charts": charts,
            "error": error,
            "eps": eps,
            "ep": ep,
            "layers": layers,
            "layer": layer,
            "can_delete": can_delete_routing_profile(request.user, record),
        },
    )
