"""Read-only access to a stored table's rows and loaded lookups, for the dashboard's figures.

Everything goes through the same per-process `ComponentTables` the REST lookup uses (one
checkout per bundle content hash), so a figure and a lookup answer read the same bytes.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING

from moetables.bundle import ComponentTable, load_table
from registry.lookup.services import BundleRef, tables_for

if TYPE_CHECKING:
    from moetables.lookup.tables import DeploymentTables
    from registry.bundles.models import DeploymentTable

__all__ = ["LoadedTable", "load_deployment"]

_ROWS_CACHE = 64
_lock = threading.Lock()
_rows: OrderedDict[tuple[str, str], ComponentTable] = OrderedDict()


@dataclass(frozen=True, slots=True)
class LoadedTable:
    lookups: DeploymentTables
    rows: ComponentTable


def load_deployment(table: DeploymentTable) -> LoadedTable:
    """The deployment's loaded lookups and its rows in file order (both cached per process)."""
    bundle = table.bundle
    tables = tables_for(BundleRef(bundle.pk, bundle.sha256))
    lookups = tables.deployment(table.tp, table.dp, table.rank, table.sequence_parallel)
    key = (bundle.sha256, table.table_path)
    with _lock:
        rows = _rows.get(key)
        if rows is not None:
            _rows.move_to_end(key)
            return LoadedTable(lookups, rows)
    rows = load_table(tables.bundle.root, lookups.entry)
    with _lock:
        _rows[key] = rows
        while len(_rows) > _ROWS_CACHE:
            _rows.popitem(last=False)
    return LoadedTable(lookups, rows)
