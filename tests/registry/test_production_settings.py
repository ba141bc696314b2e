"""Issue 17, item 9: production settings. `check --deploy` is clean under the documented
production environment, a production process refuses to start without its own secret key,
and the OpenAPI schema says which fields may be null (R44)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
KEY = "k" * 20 + "-production-key-of-the-test-0123456789abcdef"


def _manage(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "REGISTRY_"))}
    base.update(PYTHONPATH=str(REPO), REGISTRY_VAR_DIR=str(tmp_path), **env)
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=REPO,
        env=base,
        text=True,
        capture_output=True,
        timeout=120,
    )


# docs/registry.md, "Production settings": what a deployment sets.
PRODUCTION = {
    "DJANGO_DEBUG": "0",
    "DJANGO_SECRET_KEY": KEY,
    "DJANGO_ALLOWED_HOSTS": "registry.example.org",
}


def test_it_passes_check_deploy_with_the_documented_production_environment(
    tmp_path: Path,
) -> None:
    """Issue 17 item 9: it warned W004, W008, W012, W016 (and W009 with the compose key)."""
    done = _manage(tmp_path, "check", "--deploy", "--fail-level", "WARNING", **PRODUCTION)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "no issues" in done.stdout


@pytest.mark.parametrize("key", [None, "", "change-me-in-production", "short-key"])
def test_it_refuses_to_start_in_production_without_a_secret_key(
    tmp_path: Path,
    key: str | None,
) -> None:
    """Issue 17 item 9: a deployment that forgot DJANGO_SECRET_KEY ran on the public default."""
    env = {**PRODUCTION}
    env.pop("DJANGO_SECRET_KEY")
    if key is not None:
        env["DJANGO_SECRET_KEY"] = key
    done = _manage(tmp_path, "check", **env)
    assert done.returncode != 0
    assert "needs DJANGO_SECRET_KEY" in done.stderr


def test_it_still_runs_on_a_laptop_without_any_setting(tmp_path: Path) -> None:
    """Unset DJANGO_DEBUG is development: `bash scripts/run.sh` needs no key."""
    assert _manage(tmp_path, "check").returncode == 0


@pytest.mark.django_db
def test_it_documents_the_fields_that_may_be_null(client: Any) -> None:
    """Issue 17 item 9: progress, result_bundle and published_by were typed non-null."""
    import yaml

    schema = yaml.safe_load(client.get("/api/schema/").content)
    parts = schema["components"]["schemas"]
    job = parts["AcquisitionJob"]["properties"]
    assert job["progress"].get("nullable") is True
    assert job["result_bundle"].get("nullable") is True
    assert job["work_dir"].get("nullable") is True
    assert parts["BundleDetail"]["properties"]["published_by"].get("nullable") is True
