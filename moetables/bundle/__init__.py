"""The on-disk bundle format: read both layouts, validate, write the current one."""

from __future__ import annotations

from moetables.bundle.contract import contract_id
from moetables.bundle.model import (
    COLUMNS,
    COMPONENTS,
    CURRENT_SCHEMA,
    EXPERTS,
    HISTORICAL_SCHEMA,
    LOCAL_COMPONENTS,
    MODES,
    Bundle,
    ComponentTable,
    TableEntry,
)
from moetables.bundle.quality import (
    ConservationRow,
    QualityEvidence,
    StabilityRow,
    load_quality,
)
from moetables.bundle.reader import ValidationReport, open_bundle, validate_bundle
from moetables.bundle.table import load_table
from moetables.bundle.writer import (
    Row,
    TableSpec,
    attach_conservation,
    format_table,
    write_bundle,
)

__all__ = [
    "COLUMNS",
    "COMPONENTS",
    "CURRENT_SCHEMA",
    "EXPERTS",
    "HISTORICAL_SCHEMA",
    "LOCAL_COMPONENTS",
    "MODES",
    "Bundle",
    "ComponentTable",
    "ConservationRow",
    "QualityEvidence",
    "Row",
    "StabilityRow",
    "TableEntry",
    "TableSpec",
    "ValidationReport",
    "attach_conservation",
    "contract_id",
    "format_table",
    "load_quality",
    "load_table",
    "open_bundle",
    "validate_bundle",
    "write_bundle",
]
