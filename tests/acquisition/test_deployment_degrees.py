"""TP/DP/EP selection and its validation before any torch work (R6, R7)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from acquisition.catalog import resolve_model
from acquisition.cli import main
from acquisition.deployments import DegreeError, Deployment, select_deployments, targets_for

QWEN = "Qwen/Qwen3-30B-A3B-Instruct-2507"


def test_it_resolves_ep_as_tp_times_dp() -> None:
    combos = select_deployments("profile", [1, 2], None, [1, 2], None)
    assert combos == [Deployment(1, 1), Deployment(1, 2), Deployment(2, 1), Deployment(2, 2)]
    assert [c.ep for c in combos] == [1, 2, 2, 4]


def test_it_filters_full_ep_targets_with_ep() -> None:
    # The seed's example: --tp 1,2 --dp 1,2 --ep 2 acquires TP1/DP2 and TP2/DP1.
    assert select_deployments("profile", [1, 2], None, [1, 2], [2]) == [
        Deployment(1, 2),
        Deployment(2, 1),
    ]


def test_a_slice_measures_only_the_refreshed_tp() -> None:
    assert select_deployments("slice", [1, 2], [2], [1], [2]) == [Deployment(2, 1)]


def test_dp_defaults_to_one() -> None:
    assert select_deployments("slice", [1], [1], None, None) == [Deployment(1, 1)]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("slice", [2], [2], [1], None), "must include 1"),
        (("slice", [1], None, [1], None), "needs --tp-refresh"),
        (("slice", [1], [2], [1], None), "not in the session"),
        (("profile", [1], [1], [1], None), "belongs to slice"),
        (("slice", [1, 2], [2], [1], [1]), "matches no selected"),
        (("profile", [1, 2], None, [1, 2], [3]), "never adds TP or DP"),
        (("slice", [1], [1], [0], None), "positive"),
        (("slice", [1], [1], [2, 2], None), "twice"),
    ],
)
def test_it_rejects_unmatched_degrees(args: tuple, message: str) -> None:
    with pytest.raises(DegreeError, match=message):
        select_deployments(*args)


def test_every_ep_rank_is_a_target_with_the_catalog_sp_flag() -> None:
    model = resolve_model(QWEN)
    targets = targets_for(model, [Deployment(1, 2), Deployment(2, 2)])
    assert [(t.tp, t.dp, t.rank, t.sequence_parallel) for t in targets] == [
        (1, 2, 0, False),
        (1, 2, 1, False),
        (2, 2, 0, True),
        (2, 2, 1, True),
        (2, 2, 2, True),
        (2, 2, 3, True),
    ]


def test_it_refuses_more_ranks_than_experts() -> None:
    with pytest.raises(DegreeError, match="exceeds the 8 experts"):
        targets_for(resolve_model("mistralai/Mixtral-8x7B-v0.1"), [Deployment(4, 4)])


def test_the_cli_reports_degree_errors_with_status_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status = main(
        [
            "slice",
            QWEN,
            "--hardware",
            "H200",
            "--tp",
            "1,2",
            "--tp-refresh",
            "2",
            "--dp",
            "1",
            "--ep",
            "4",
            "--out-root",
            str(tmp_path),
        ]
    )
    assert status == 2
    assert "--ep [4] matches no selected TP x DP (TP2xDP1=2)" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())  # nothing written


def test_the_cli_rejects_force(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status = main(
        [
            "slice",
            QWEN,
            "--hardware",
            "H200",
            "--tp-refresh",
            "1",
            "--out-root",
            str(tmp_path),
            "--force",
        ]
    )
    assert status == 2
    assert "another --out-root" in capsys.readouterr().err


def test_validation_and_dry_run_never_import_torch(tmp_path: Path) -> None:
    code = (
        "import sys\n"
        "from acquisition.cli import main\n"
        f"bad = main(['slice', '{QWEN}', '--hardware', 'H', '--tp-refresh', '1', '--dp', '2',"
        f" '--ep', '1', '--out-root', {str(tmp_path)!r}])\n"
        f"ok = main(['slice', '{QWEN}', '--hardware', 'H', '--tp-refresh', '1', '--dp', '1,2',"
        f" '--out-root', {str(tmp_path)!r}, '--dry-run', '--max-num-seqs', '128'])\n"
        "assert (bad, ok) == (2, 0), (bad, ok)\n"
        "assert 'torch' not in sys.modules, 'validation imported torch'\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
    assert "dp2_ep2_rank1_sp0" in result.stderr
