"""The command lines the README and docs/estimate.md show name every option the CLI has, so a
user reading them learns of captured routing and the tile cost (session 6 QA)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from moetables.cli import main

REPO = Path(__file__).resolve().parents[2]


def _options(command: str, capsys: pytest.CaptureFixture[str]) -> set[str]:
    with pytest.raises(SystemExit):
        main([command, "--help"])
    return set(re.findall(r"--[a-z][a-z-]+", capsys.readouterr().out)) - {"--help"}


def _section(text: str, heading: str) -> str:
    start = text.index(heading)
    end = text.find("\n## ", start + len(heading))
    return text[start : end if end >= 0 else len(text)]


@pytest.mark.parametrize(
    ("doc", "heading"), [("README.md", "## Command line"), ("docs/estimate.md", "```\npython -m")]
)
def test_the_estimate_command_line_shown_names_every_option(
    capsys: pytest.CaptureFixture[str], doc: str, heading: str
) -> None:
    shown = _section((REPO / doc).read_text(), heading)
    block = shown[: shown.index("```", 4)] if heading.startswith("```") else shown
    missing = sorted(o for o in _options("estimate", capsys) if o not in block)
    assert not missing, f"{doc} does not show {missing}"
    policies = re.search(r"--policy \[?([a-z_|]+)", block)
    assert policies is not None
    assert "captured" in policies.group(1).split("|")
