"""A bundle write stopped by a kill leaves nothing lost or half-written for the next one (R43).

The writer stages beside the bundle, moves the old one aside, moves the stage in and deletes
the old one. A kill (SIGKILL: no cleanup runs) can stop it at any of those steps; the next
write of the same bundle repairs what was left and says so.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pytest

from moetables.bundle import open_bundle, validate_bundle
from moetables.bundle.writer import recover_interrupted_write, write_bundle
from moetables.geometry import MoeTarget
from tests.moetables.conftest import HEADER, make_spec

RANK0, RANK1, DP1 = (
    MoeTarget.for_rank(1, 2, 0),
    MoeTarget.for_rank(1, 2, 1),
    MoeTarget.for_rank(1, 1, 0),
)


def _keys(bundle: Path) -> list[str]:
    return sorted(e.target.key for e in open_bundle(bundle).entries)


def test_a_kill_between_the_two_moves_loses_no_bundle(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    dest = tmp_path / "bf16"
    write_bundle(dest, HEADER, [make_spec(RANK0), make_spec(DP1)])
    # The state a kill leaves after `dest -> .bf16.old-PID` and before `stage -> dest`.
    dest.rename(tmp_path / ".bf16.old-4242")
    shutil.copytree(tmp_path / ".bf16.old-4242", tmp_path / ".bf16.k2x9_a7q")
    with caplog.at_level(logging.WARNING, logger="moetables.bundle.writer"):
        write_bundle(dest, HEADER, [make_spec(RANK1)])
    # The old bundle came back and the new target was merged into it: nothing lost.
    assert _keys(dest) == sorted([RANK0.key, RANK1.key, DP1.key])
    assert validate_bundle(dest).ok
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir()) == ["bf16"]
    said = caplog.text
    assert "restored" in said and ".bf16.old-4242" in said
    assert "removed .bf16.k2x9_a7q" in said


def test_leftovers_beside_a_whole_bundle_are_removed_and_others_kept(tmp_path: Path) -> None:
    dest = tmp_path / "bf16"
    write_bundle(dest, HEADER, [make_spec(RANK0)])
    (tmp_path / ".bf16.old-7").mkdir()  # killed after the swap, before deleting the old copy
    (tmp_path / ".bf16.abcdefgh").mkdir()  # killed while staging
    # Not a writer's: another bundle's stage, the lock file, a user's folder.
    (tmp_path / ".fp8.abcdefgh").mkdir()
    (tmp_path / "notes.abcdefgh").mkdir()
    lines = recover_interrupted_write(dest)
    assert lines == [
        "removed .bf16.abcdefgh beside bf16, left by a write that was stopped",
        "removed .bf16.old-7 beside bf16, left by a write that was stopped",
    ]
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == [".bf16.meta.lock", ".fp8.abcdefgh", "bf16", "notes.abcdefgh"]
    assert _keys(dest) == [RANK0.key]
    assert recover_interrupted_write(dest) == []  # nothing left: nothing said
    assert recover_interrupted_write(tmp_path / "absent" / "bf16") == []
