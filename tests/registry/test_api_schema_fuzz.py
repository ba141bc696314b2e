"""Issue 17: the REST API against its own OpenAPI schema (schemathesis), bounded for CI: no
request answers a server error, and every response conforms to the documented schema (status
codes, content types, headers, bodies). The longer recorded run is bench/reliability.py (R44).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("schemathesis")

from tests.registry.schema_fuzz import run_schema

pytestmark = pytest.mark.django_db

EXAMPLES = int(os.environ.get("SCHEMATHESIS_EXAMPLES", "15"))


@pytest.fixture
def wsgi_app() -> Iterator[Any]:
    """Django's WSGI application, keeping the test's database connection open between
    requests (as Django's own test client does)."""
    from django.core.signals import request_finished, request_started
    from django.core.wsgi import get_wsgi_application
    from django.db import close_old_connections

    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    yield get_wsgi_application()
    request_started.connect(close_old_connections)
    request_finished.connect(close_old_connections)


@pytest.mark.parametrize("signed_in", [False, True])
def test_it_answers_every_generated_request_as_documented(
    published: Any,
    wsgi_app: Any,
    signed_in: bool,
) -> None:
    """Issue 17: 0 server errors and 0 responses that break the documented schema, anonymous
    and with a valid token."""
    headers = None
    if signed_in:
        from django.contrib.auth import get_user_model
        from rest_framework.authtoken.models import Token

        user = get_user_model().objects.create_user("fuzzer")
        headers = {"Authorization": f"Token {Token.objects.create(user=user).key}"}
    run = run_schema(wsgi_app, EXAMPLES, headers=headers)
    assert run.calls > 50
    assert run.server_errors == 0, run.failures
    assert run.failures == {}, "\n\n".join(f"{k}\n{v}" for k, v in run.failures.items())
