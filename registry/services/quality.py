"""A stored table's quality evidence (stability, conservation) as the API and the pages show it.

The evidence is read from the bundle's own files through moetables (checksums and the
cross-check against the table included), from the same checkout the lookups use.
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

from moetables.bundle import QualityEvidence, load_quality
from moetables.bundle.model import METHOD_TOLERANCE
from registry.lookup.services import BundleRef, tables_for
from registry.services.figures import load_deployment

if TYPE_CHECKING:
    from registry.bundles.models import DeploymentTable

__all__ = ["conservation_payload", "stability_payload", "table_evidence", "table_quality"]

_CACHE = 64
_lock = threading.Lock()
_evidence: OrderedDict[tuple[str, str], QualityEvidence] = OrderedDict()


# What the API and the page show of a supplementary trace's provenance.
SUPPLEMENT_SHOWN = (
    "measured",
    "measured_at",
    "table_measured_at",
    "command_line",
    "device_name",
    "uuid",
    "torch_version",
    "cuda_version",
    "vllm_version",
    "note",
)


def table_evidence(table: DeploymentTable) -> QualityEvidence:
    """The table's evidence, validated once per process and bundle content."""
    key = (table.bundle.sha256, table.table_path)
    with _lock:
        found = _evidence.get(key)
        if found is not None:
            _evidence.move_to_end(key)
            return found
    loaded = load_deployment(table)
    root = tables_for(BundleRef(table.bundle.pk, table.bundle.sha256)).bundle.root
    found = load_quality(root, loaded.lookups.entry, loaded.rows)
    with _lock:
        _evidence[key] = found
        while len(_evidence) > _CACHE:
            _evidence.popitem(last=False)
    return found


def _num(value: float) -> float | None:
    return None if not math.isfinite(value) else value


def _tolerance(table: DeploymentTable) -> float:
    conditioning = table.contract.get("expert_conditioning")
    raw = conditioning.get("quality_relative_tolerance") if isinstance(conditioning, dict) else None
    return float(raw) if isinstance(raw, int | float) else METHOD_TOLERANCE


def table_quality(table: DeploymentTable) -> dict[str, Any]:
    """The compact verdict a list or a matrix cell shows, from the stored contract only."""
    tolerance = _tolerance(table)
    summary = table.coverage.get("conditioning_summary")
    summary = summary if isinstance(summary, dict) else {}
    change = summary.get("max_relative_change")
    controls = table.coverage.get("conditioning_controls")
    if change is None and isinstance(controls, list):
        changes = [
            abs(c["relative_change"])
            for c in controls
            if isinstance(c, dict) and isinstance(c.get("relative_change"), int | float)
        ]
        change = max(changes, default=None)
    exploratory = table.contract.get("quality") == "exploratory" or tolerance > METHOD_TOLERANCE
    change = change if isinstance(change, int | float) else None
    return {
        "label": "exploratory" if exploratory else "method",
        "tolerance": tolerance,
        "max_relative_change": change,
        "max_change_text": f"{change:.2%}" if change is not None else None,
    }


def stability_payload(table: DeploymentTable) -> dict[str, Any]:
    evidence = table_evidence(table)
    rows = evidence.stability or ()
    points = [
        {
            "component": r.component,
            "tokens": r.tokens,
            "activated_experts": r.activated_experts,
            "local_assignments": r.local_assignments,
            "attempt": r.attempt,
            "b_sets": r.b_sets or None,
            "b_median_us": _num(r.b_median_us),
            "b_pooled_us": _num(r.b_pooled_us),
            "b2_sets": r.b2_sets or None,
            "b2_median_us": _num(r.b2_median_us),
            "b2_pooled_us": _num(r.b2_pooled_us),
            "relative_change": r.relative_change,
            "tolerance": r.tolerance,
            "passed": r.passed,
            "published": r.published,
        }
        for r in rows
    ]
    retried = {r.point for r in rows if r.attempt > 0}
    return {
        "table": table.pk,
        "source": evidence.source,
        "absent": evidence.stability_absent,
        "quality": table_quality(table),
        "summary": {
            "published_points": sum(r.published for r in rows),
            "controls": len(rows),
            "failed_controls": sum(not r.passed for r in rows),
            "retried_points": len(retried),
            "max_relative_change": max(
                (r.relative_change for r in rows if r.published), default=None
            ),
        },
        "points": points,
    }


def conservation_payload(table: DeploymentTable) -> dict[str, Any]:
    evidence = table_evidence(table)
    forwards = [
        {
            "forward": r.forward,
            "tokens": r.tokens,
            "native_total_us": r.native_total_us,
            "outside_scopes_us": r.outside_scopes_us,
            "components_us": dict(r.components_us),
            "attributed_us": round(r.attributed_us, 6),
        }
        for r in evidence.conservation or ()
    ]
    supplement = evidence.conservation_supplement
    return {
        "table": table.pk,
        "source": evidence.source,
        "absent": evidence.conservation_absent,
        # Traced after the table, by a separate process (python -m acquisition conserve): when,
        # how and on what; the per-scope activity lists stay in the bundle.
        "supplement": None
        if supplement is None
        else {k: supplement.get(k) for k in SUPPLEMENT_SHOWN if k in supplement},
        "forwards": forwards,
    }
