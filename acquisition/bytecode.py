"""Whether this Python compiles the acquisition's heavy packages from source in every process.

A pip install writes bytecode when it installs, so ``import vllm`` reads compiled modules. Some
images (the lent H200 host among them) ship site-packages without ``.pyc`` and set
``PYTHONDONTWRITEBYTECODE=1``: then every acquisition process, and every isolated target's
child, compiles torch's and vLLM's import closure again (about 16 s of a 27 s start measured on
the H200: docs/benchmarks.md, issue 19, "Seventh pass"). The acquisition does not change the
interpreter's settings behind the user's back; it says so once at the start, with the fix.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Sequence
from pathlib import Path

__all__ = ["HEAVY_PACKAGES", "bytecode_note", "uncached_packages"]

HEAVY_PACKAGES = ("torch", "vllm", "transformers")


def uncached_packages(packages: Sequence[str] = HEAVY_PACKAGES) -> list[str]:
    """The installed packages among ``packages`` that this process will compile from source.

    A package counts when bytecode is not written (``sys.dont_write_bytecode``) and its
    ``__init__`` has no compiled file where this interpreter looks for one (next to the
    source, or under ``sys.pycache_prefix`` when one is set). Nothing is imported.
    """
    if not sys.dont_write_bytecode:
        return []
    found = []
    for name in packages:
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            continue
        origin = spec.origin if spec is not None else None
        if not origin or not origin.endswith(".py"):
            continue
        if not Path(importlib.util.cache_from_source(origin)).exists():
            found.append(name)
    return found


def bytecode_note(missing: Sequence[str]) -> str | None:
    """One line for the start of a run about ``missing`` (from `uncached_packages`), or None."""
    if not missing:
        return None
    return (
        f"{', '.join(missing)}: no bytecode installed and PYTHONDONTWRITEBYTECODE is set, so "
        "every acquisition process compiles them from source (about 16 s a process on the "
        "H200 host); to keep it once: unset PYTHONDONTWRITEBYTECODE and set "
        'PYTHONPYCACHEPREFIX=DIR (docs/acquisition.md, "Bytecode")'
    )
