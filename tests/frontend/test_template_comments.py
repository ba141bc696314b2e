"""Django's `{# #}` comment ends at its line: a `{#` whose `#}` is on a later line is not a
comment, and its text is sent to the browser (two templates did so: the playground's load fields
showed their own comment, and ReDoc's page began with text before its doctype)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TEMPLATES = sorted(
    p
    for root in ("frontend", "registry", "config")
    for p in (REPO / root).rglob("templates/**/*.html")
)
UNCLOSED = re.compile(r"\{#(?![^\n]*#\})")


def test_there_are_templates_to_check() -> None:
    assert len(TEMPLATES) > 10


@pytest.mark.parametrize("path", TEMPLATES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_comment_closes_on_its_line(path: Path) -> None:
    text = path.read_text()
    bad = [text.count("\n", 0, m.start()) + 1 for m in UNCLOSED.finditer(text)]
    assert not bad, f"{path.relative_to(REPO)}: {{# without #}} on lines {bad}"


def test_the_api_docs_page_starts_with_its_doctype(client: object) -> None:
    response = client.get("/api/redoc/")  # type: ignore[attr-defined]
    assert response.status_code == 200
    assert response.content.lstrip().startswith(b"<!DOCTYPE html>")
