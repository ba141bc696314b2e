"""Exact lookups over measured component tables (work in progress in this commit)."""

from __future__ import annotations

ComponentTables = None
DeploymentTables = None
