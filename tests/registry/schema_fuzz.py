"""The schemathesis harness shared by the CI test (tests/registry/test_api_schema_fuzz.py) and
the recorded run (bench/reliability.py): every operation of the OpenAPI schema, driven by
hypothesis, each response checked against the schema (issue 17).

Schemathesis' pytest plugin does not load under pytest 9, so each operation's strategy is
driven by hypothesis directly: the same generated cases and the same checks.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

__all__ = ["CHECKS", "SchemaRun", "run_schema"]

CHECKS = [
    schemathesis.checks.not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
]


@dataclass
class SchemaRun:
    calls: int = 0
    statuses: Counter[int] = field(default_factory=Counter)
    server_errors: int = 0
    failures: dict[str, str] = field(default_factory=dict)  # distinct: operation + title

    @property
    def ok(self) -> bool:
        return not self.failures and not self.server_errors


def _titles(exc: BaseException) -> list[str]:
    if isinstance(exc, BaseExceptionGroup):
        return [t for inner in exc.exceptions for t in _titles(inner)]
    return [getattr(exc, "title", type(exc).__name__)]


def run_schema(
    app: Any, examples: int, *, headers: dict[str, str] | None = None, seed: int | None = 0
) -> SchemaRun:
    """``examples`` generated requests per operation against the WSGI ``app``."""
    schema = schemathesis.openapi.from_wsgi("/api/schema/", app)
    run = SchemaRun()
    for result in schema.get_all_operations():
        _run_operation(result.ok(), run, examples, headers, seed)
    return run


def _run_operation(
    operation: Any, run: SchemaRun, examples: int, headers: dict[str, str] | None, seed: int | None
) -> None:
    if True:

        @given(case=operation.as_strategy())
        @settings(
            max_examples=examples,
            deadline=None,
            derandomize=seed is not None,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        def one(case: Any) -> None:
            run.calls += 1
            response = case.call(headers=headers)
            run.statuses[response.status_code] += 1
            if response.status_code >= 500:
                run.server_errors += 1
            try:
                case.validate_response(response, checks=CHECKS)
            except BaseException as exc:  # every check failure is recorded
                if isinstance(exc, KeyboardInterrupt):
                    raise
                for title in _titles(exc):
                    key = f"{operation.label}: {title}"
                    run.failures.setdefault(key, str(exc)[:800])

        one()
