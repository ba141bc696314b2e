"""Issue 13.1: every table says what executed it (adapter, kernel, native, vLLM version), for
new publications and, by the data migration, for bundles published before."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from registry.bundles.services import publish_bundle
from registry.bundles.services.describe import table_identity


def test_it_reads_current_and_historical_contracts() -> None:
    current = {
        "backend": {
            "name": "vllm-live",
            "native": True,
            "native_backend": "TRITON",
            "vllm_version": "0.26.0",
        }
    }
    reference = {"backend": {"name": "torch-reference", "native": False}}
    historical = {
        "expert_region": {
            "schema": "native-modular-expert-region-v1",
            "backend": "TRITON",
            "vllm_version": "0.28.0",
        }
    }
    assert table_identity(current) == {
        "backend": "vllm-live",
        "kernel": "TRITON",
        "native": True,
        "vllm_version": "0.26.0",
    }
    assert table_identity(reference) == {
        "backend": "torch-reference",
        "kernel": "",
        "native": False,
        "vllm_version": "",
    }
    assert table_identity(historical) == {
        "backend": "vllm-modular",
        "kernel": "TRITON",
        "native": True,
        "vllm_version": "0.28.0",
    }


@pytest.mark.django_db(transaction=True)
def test_the_migration_fills_bundles_published_before(make_bundle: Any) -> None:
    """Publish, blank the columns as 0006 left them, migrate 0006 -> 0007: filled again."""
    bundle = publish_bundle(make_bundle(dp=2, vllm_version="0.26.0")).bundle
    executor = MigrationExecutor(connection)
    executor.migrate([("registry", "0006_merge_0004_coverage_requests_0005_hash_api_tokens")])
    with connection.cursor() as cursor:
        cursor.execute("UPDATE registry_deploymenttable SET backend = 'TRITON'")
        cursor.execute("UPDATE registry_bundle SET vllm_version = '', targets = '[]'")
    executor = MigrationExecutor(connection)
    executor.migrate([("registry", "0007_table_identity")])
    executor = MigrationExecutor(connection)
    executor.migrate(executor.loader.graph.leaf_nodes())  # back to the latest schema
    bundle.refresh_from_db()
    assert bundle.vllm_version == "0.26.0"
    assert [(t["backend"], t["kernel"], t["vllm_version"]) for t in bundle.targets] == [
        ("vllm-modular", "TRITON", "0.26.0")
    ] * 2
    assert {t.backend for t in bundle.tables.all()} == {"vllm-modular"}
