"""The coverage matrix: which hardware, model, variant and backend has which deployment table.

Rows are (hardware, model, variant, backend); columns every deployment rank any bundle covers
(TP, DP, EP, rank, sequence parallel), so a row's missing ranks show as gaps. A cell holds the
newest measurement of its row and column (the table's own time, else its bundle's; the later
publication among equals). A gap its backend cannot measure keeps its full reason
(``not_measurable``) and points to the row's list of distinct reasons (``reason``, from 1), so
that the page says each reason once per row.
"""

from __future__ import annotations

import datetime as dt
import re
from typing import Any

from django.urls import reverse

from registry.bundles.models import DeploymentTable
from registry.services.quality import table_quality
from registry.services.requests import not_measurable, open_request_index

__all__ = ["Deployment", "coverage_matrix", "deployment_label", "row_reason"]

Deployment = tuple[int, int, int, int, bool]  # tp, dp, ep, rank, sequence_parallel


# The deployment a reason names ("target TP1/DP2/EP2: ..."): the row's note says it once for
# every cell it applies to, and each cell keeps its full text for the API.
_TARGET_PREFIX = re.compile(r"target TP\d+/DP\d+/EP\d+(?: with sequence parallelism)?: ")


def row_reason(problem: str) -> str:
    """A cell's "not measurable by <backend>: <reason>" without the cell's own deployment."""
    return _TARGET_PREFIX.sub("", problem)


def deployment_label(d: Deployment) -> str:
    tp, dp, ep, rank, sp = d
    return f"tp{tp} dp{dp}_ep{ep}_rank{rank}_sp{int(sp)}"


_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


def _measured(table: DeploymentTable) -> dt.datetime | None:
    return table.measured_at or table.bundle.measured_at


def coverage_matrix(
    open_requests: dict[tuple[Any, ...], dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """The matrix as plain data (the page and ``GET /api/v1/coverage/`` show the same)."""
    if open_requests is None:
        open_requests = open_request_index()
    tables = (
        DeploymentTable.objects.select_related("bundle")
        .only(
            "id",
            "tp",
            "dp",
            "ep",
            "rank",
            "sequence_parallel",
            "backend",
            "row_count",
            "contract",
            "coverage",
            "measured_at",
            "bundle__id",
            "bundle__hardware",
            "bundle__model",
            "bundle__variant",
            "bundle__measured_at",
            "bundle__published_at",
        )
        .order_by("bundle__published_at", "bundle_id")
    )
    # Each cell shows its target's newest measurement: a bundle's tables can be measured days
    # apart (ranks moved in later), so the table's own time, else its bundle's; the sort is
    # stable, so among equals the later publication wins.
    ranked = sorted(tables, key=lambda t: (_measured(t) is not None, _measured(t) or _EPOCH))
    latest: dict[tuple[str, str, str, str], dict[Deployment, DeploymentTable]] = {}
    columns: set[Deployment] = set()
    for table in ranked:
        b = table.bundle
        row = (b.hardware, b.model, b.variant, table.backend or "unknown")
        d: Deployment = (table.tp, table.dp, table.ep, table.rank, table.sequence_parallel)
        columns.add(d)
        latest.setdefault(row, {})[d] = table  # newer measurements replace older ones
    ordered = sorted(columns)
    rows = []
    gaps = 0
    for key in sorted(latest):
        cells = []
        reasons: list[str] = []
        for d in ordered:
            found = latest[key].get(d)
            if found is None:
                gaps += 1
                problem = not_measurable(key[3], key[1], d)
                index = None
                if problem is not None:
                    reason = row_reason(problem)
                    if reason not in reasons:
                        reasons.append(reason)
                    index = reasons.index(reason) + 1
                cells.append(
                    {
                        "deployment": deployment_label(d),
                        "tp": d[0],
                        "dp": d[1],
                        "ep": d[2],
                        "rank": d[3],
                        "sp": int(d[4]),
                        "table": None,
                        "url": None,
                        "points": None,
                        "measured_at": None,
                        "quality": None,
                        "request": open_requests.get((*key, *d)),
                        "not_measurable": problem,
                        "reason": index,
                    }
                )
                continue
            b = found.bundle
            cells.append(
                {
                    "deployment": deployment_label(d),
                    "tp": d[0],
                    "dp": d[1],
                    "ep": d[2],
                    "rank": d[3],
                    "sp": int(d[4]),
                    "table": found.pk,
                    "url": reverse("frontend:table", kwargs={"pk": found.pk}),
                    "points": found.row_count,
                    "measured_at": _measured(found) or b.published_at,
                    "quality": table_quality(found),
                    "request": None,
                    "not_measurable": None,
                    "reason": None,
                }
            )
        rows.append(
            {
                "hardware": key[0],
                "model": key[1],
                "variant": key[2],
                "backend": key[3],
                "reasons": reasons,
                "cells": cells,
            }
        )
    return {
        "deployments": [
            {
                "tp": d[0],
                "dp": d[1],
                "ep": d[2],
                "rank": d[3],
                "sequence_parallel": d[4],
                "label": deployment_label(d),
            }
            for d in ordered
        ],
        "rows": rows,
        "gaps": gaps,
    }
