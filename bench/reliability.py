"""Issue 17's recorded hardening run: hostile archives and schemathesis against a registry
on SQLite or PostgreSQL, in process (Django's test client over the real middleware stack).

    python bench/reliability.py --archives 10000 --schema-examples 200            # SQLite
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/h_sec \\
        python bench/reliability.py --archives 10000 --schema-examples 200        # PostgreSQL

Hostile archives: a valid one-table bundle with one mutation each (tests/registry/hostile.py:
21 structural rule breaks and random byte edits of the tar or gzip stream). Counted: server
errors (5xx), accepted bad (a rule-breaking archive accepted, or an accepted one that is not a
valid bundle as stored), left behind (blobs, staging files or rows after a refusal). Then
every operation of the OpenAPI schema through schemathesis (tests/registry/schema_fuzz.py),
anonymous and with a token. PostgreSQL: the named database is flushed first (use your own).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--archives", type=int, default=10_000)
    parser.add_argument("--schema-examples", type=int, default=200)
    parser.add_argument("--seed", type=int, default=17)
    parser.add_argument("--out", type=Path, help="write the summary JSON here")
    args = parser.parse_args()

    var = Path(tempfile.mkdtemp(prefix="reliability-"))
    os.environ.update(
        DJANGO_SETTINGS_MODULE="config.settings",
        REGISTRY_VAR_DIR=str(var),
        DJANGO_ALLOWED_HOSTS="testserver,localhost",
        REGISTRY_UPLOAD_THROTTLE="",
        REGISTRY_JOB_THROTTLE="",
        REGISTRY_SIGNIN_THROTTLE="",
    )
    import django

    django.setup()
    from django.conf import settings
    from django.core.management import call_command
    from django.db import connection
    from django.test import Client

    call_command("migrate", verbosity=0)
    if connection.vendor != "sqlite":
        call_command("flush", interactive=False, verbosity=0)
    from django.contrib.auth import get_user_model
    from rest_framework.authtoken.models import Token

    user = get_user_model().objects.create_user("fuzzer")
    key = Token.objects.create(user=user).key
    client = Client(HTTP_AUTHORIZATION=f"Token {key}", raise_request_exception=False)

    from tests.registry.hostile import (
        FuzzReport,
        Hostile,
        _set_meta,
        base_members,
        make_hostile,
        tar_gz,
        upload_and_check,
    )

    members = base_members(var / "base" / "bundle")
    report = FuzzReport()
    latency: dict[str, list[float]] = {}
    start = time.perf_counter()
    good = refused_good = 0
    for index in range(args.archives):
        if index % 50 == 0:  # a control: a valid bundle (a new variant) must be accepted
            valid = tar_gz(
                _set_meta(members, lambda m, i=index: m.__setitem__("variant", f"bf16-control-{i}"))
            )
            good += 1
            if upload_and_check(client, Hostile("valid control", valid, False), var, report) != 201:
                refused_good += 1
            continue
        hostile = make_hostile(random.Random(args.seed * 1_000_003 + index), members)
        began = time.perf_counter()
        upload_and_check(client, hostile, var, report)
        latency.setdefault(hostile.mutation, []).append(time.perf_counter() - began)
    archive_s = time.perf_counter() - start

    from django.core.signals import request_finished, request_started
    from django.core.wsgi import get_wsgi_application
    from django.db import close_old_connections

    from tests.registry.schema_fuzz import run_schema

    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    app = get_wsgi_application()
    start = time.perf_counter()
    anonymous = run_schema(app, args.schema_examples, seed=args.seed)
    signed_in = run_schema(
        app, args.schema_examples, seed=args.seed, headers={"Authorization": f"Token {key}"}
    )
    schema_s = time.perf_counter() - start

    summary: dict[str, Any] = {
        "database": connection.vendor,
        "archives": {
            "uploads": report.uploads,
            "refused": report.refused,
            "accepted": report.accepted,
            "valid_controls": good,
            "valid_controls_refused": refused_good,
            "server_errors": len(report.server_errors or []),
            "accepted_bad": len(report.accepted_bad or []),
            "left_behind": len(report.left_behind or []),
            "seconds": round(archive_s, 1),
            "examples": (report.server_errors or [])[:3]
            + (report.accepted_bad or [])[:3]
            + (report.left_behind or [])[:3],
            "by_mutation": {
                name: {
                    "count": len(times),
                    "median_ms": round(1000 * statistics.median(times), 1),
                    "max_ms": round(1000 * max(times), 1),
                }
                for name, times in sorted(latency.items())
            },
        },
        "schemathesis": {
            label: {
                "calls": run.calls,
                "server_errors": run.server_errors,
                "failures": len(run.failures),
                "statuses": dict(sorted(run.statuses.items())),
                "examples": list(run.failures)[:5],
            }
            for label, run in (("anonymous", anonymous), ("token", signed_in))
        },
        "schemathesis_seconds": round(schema_s, 1),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "limits": {
            k: settings.REGISTRY[k]
            for k in ("MAX_ARCHIVE_BYTES", "MAX_UNPACKED_BYTES", "MAX_FILES", "USER_QUOTA_BYTES")
        },
    }
    text = json.dumps(summary, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
