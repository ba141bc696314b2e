"""Debian's chromium under Playwright, as every browser test here launches it.

One owner for the executable, its flags and the launch, so that what a launch must undo is
undone once: the fixtures and tests run the ORM while ``sync_playwright`` is open, and Django's
connection handler (an asgiref Local, kept per contextvars context) stores that connection
where pytest-django's teardown, after the block, does not see it. Left open, it kept the test
database from being dropped ("being accessed by other users"; traced in session 13: the
leftover session's wrapper sat in another context's storage). `launched` closes it from
inside the block, where it is visible.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

# Playwright's sync API runs an event loop in this thread; Django's ORM calls made by the
# fixtures are still plain synchronous code.
os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")

# CHROMIUM names another Debian chromium build (e.g. one unpacked with dpkg -x).
CHROMIUM = Path(os.environ.get("CHROMIUM", "/usr/bin/chromium"))
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


@contextmanager
def launched() -> Iterator[Any]:
    """A headless chromium; skips where Playwright or chromium is missing."""
    sync_api = pytest.importorskip("playwright.sync_api")
    if not CHROMIUM.exists():
        pytest.skip("apt-get install -y chromium")
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        try:
            yield browser
        finally:
            browser.close()
            from django.db import connections

            connections.close_all()
