"""Fixtures of the acquisition tests."""

from __future__ import annotations

from pathlib import Path

import pytest
from tiny_moe import write_model


@pytest.fixture
def tiny_model(tmp_path: Path) -> Path:
    return write_model(tmp_path / "tiny-moe")
