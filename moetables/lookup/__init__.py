"""Exact lookups: 1-D local curves, expert surfaces, deployment selection and caches."""

from __future__ import annotations

from moetables.lookup.codes import CODE_NAMES, INVALID, OK, OUT_OF_SUPPORT
from moetables.lookup.queries import (
    LookupRequest,
    Query,
    RequestError,
    parse_query,
    parse_request,
)
from moetables.lookup.segments import SegmentedExpertSurface
from moetables.lookup.surface import ExpertSurface
from moetables.lookup.tables import BatchResult, ComponentTables, DeploymentTables

__all__ = [
    "CODE_NAMES",
    "INVALID",
    "OK",
    "OUT_OF_SUPPORT",
    "BatchResult",
    "ComponentTables",
    "DeploymentTables",
    "ExpertSurface",
    "LookupRequest",
    "Query",
    "RequestError",
    "SegmentedExpertSurface",
    "parse_query",
    "parse_request",
]
