"""acquisition.bytecode: the start-of-run note when every process compiles torch and vLLM anew.

Issue 19's seventh pass found the lent H200 host shipping site-packages without bytecode and
with PYTHONDONTWRITEBYTECODE=1: 16 s of a 27 s start. The note must appear exactly then, and
never when bytecode is installed, under a cache prefix, or can be written.
"""

from __future__ import annotations

import importlib.util
import py_compile
import sys
from pathlib import Path

import pytest

from acquisition.bytecode import bytecode_note, uncached_packages
from acquisition.cli import _note_bytecode
from acquisition.phases import PhaseClock
from acquisition.progress import ProgressReporter


@pytest.fixture
def package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A package ``heavy_pkg`` on sys.path with source only."""
    root = tmp_path / "site"
    (root / "heavy_pkg").mkdir(parents=True)
    init = root / "heavy_pkg" / "__init__.py"
    init.write_text("VALUE = 1\n")
    monkeypatch.syspath_prepend(str(root))
    monkeypatch.setattr(sys, "pycache_prefix", None)
    importlib.invalidate_caches()
    return init


def test_no_bytecode_and_none_written_is_reported(
    package: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    assert uncached_packages(["heavy_pkg", "no_such_package_here"]) == ["heavy_pkg"]
    note = bytecode_note(["heavy_pkg"])
    assert note is not None
    assert (
        "heavy_pkg" in note and "PYTHONPYCACHEPREFIX" in note and "PYTHONDONTWRITEBYTECODE" in note
    )


def test_bytecode_that_can_be_written_is_not_reported(
    package: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "dont_write_bytecode", False)
    assert uncached_packages(["heavy_pkg"]) == []
    assert bytecode_note([]) is None


def test_installed_bytecode_is_found_next_to_the_source(
    package: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    py_compile.compile(str(package), cfile=importlib.util.cache_from_source(str(package)))
    assert uncached_packages(["heavy_pkg"]) == []


def test_bytecode_under_a_cache_prefix_counts_and_the_prefix_is_where_it_looks(
    package: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    # Bytecode next to the source does not count once a prefix is set: Python reads the prefix.
    py_compile.compile(str(package), cfile=importlib.util.cache_from_source(str(package)))
    monkeypatch.setattr(sys, "pycache_prefix", str(tmp_path / "prefix"))
    assert uncached_packages(["heavy_pkg"]) == ["heavy_pkg"]
    cached = Path(importlib.util.cache_from_source(str(package)))
    assert str(cached).startswith(str(tmp_path / "prefix"))
    cached.parent.mkdir(parents=True)
    py_compile.compile(str(package), cfile=str(cached))
    assert uncached_packages(["heavy_pkg"]) == []


def test_the_cli_says_it_once_and_records_it_in_the_phase_log(
    package: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    monkeypatch.setattr(
        "acquisition.cli.uncached_packages", lambda: uncached_packages(["heavy_pkg"])
    )
    clock = PhaseClock()
    _note_bytecode(ProgressReporter(None, bar=False, total=0), clock)
    err = capsys.readouterr().err
    assert err.count("heavy_pkg: no bytecode installed") == 1
    assert clock.record()["targets"]["run"]["notes"]["bytecode"] == {
        "uncached": ["heavy_pkg"],
        "dont_write": True,
    }
    monkeypatch.setattr(sys, "dont_write_bytecode", False)
    clock = PhaseClock()
    _note_bytecode(ProgressReporter(None, bar=False, total=0), clock)
    assert capsys.readouterr().err == ""
