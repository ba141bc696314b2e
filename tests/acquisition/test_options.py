"""One options schema: the CLI parser, a job's validation and argv, and the docs table all come
from `acquisition.options.OPTIONS` (R6-R9: the seed's interface)."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from acquisition.cli import build_parser
from acquisition.options import (
    BACKEND_NAMES,
    NON_FIELD,
    OPTIONS,
    OptionErrors,
    from_namespace,
    job_argv,
    job_options,
    markdown_table,
    validate_job,
)

REPO = Path(__file__).resolve().parents[2]
QWEN = "Qwen/Qwen3-30B-A3B-Instruct-2507"


def _subcommand_actions(command: str) -> dict[str, argparse.Action]:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return {a.dest: a for a in sub.choices[command]._actions if a.dest != "help"}


def test_it_builds_every_cli_option_from_the_schema() -> None:
    """R6: each option's flag, default and choices in the parser are the schema's."""
    for command in ("slice", "profile"):
        actions = _subcommand_actions(command)
        assert set(actions) == {o.name for o in OPTIONS if o.name != "command"}
        for option in OPTIONS:
            if option.flag is None:
                continue
            action = actions[option.name]
            assert action.option_strings == [option.flag]
            assert action.default == option.default
            assert tuple(action.choices or ()) == option.choices
            assert action.required == option.required


def test_it_lists_the_adapters_names_as_backend_choices() -> None:
    from acquisition.adapters import backend_names

    assert list(BACKEND_NAMES) == backend_names()


def test_it_round_trips_a_job_through_the_argv_the_worker_runs(tmp_path: Path) -> None:
    """R7: the argv of validated parameters parses back to the same values."""
    params = validate_job(
        {
            "model": QWEN,
            "hardware": "H200",
            "command": "profile",
            "tp": "1,2",
            "dp": [2],
            "ep": [2, 4],
            "rounds": 5,
            "grid_factor": 1.5,
            "cache_bytes": 1 << 30,
        }
    )
    argv = job_argv(params, out_root=tmp_path, progress_json=tmp_path / "p.jsonl")
    options = from_namespace(build_parser().parse_args(argv))
    for option in job_options():
        assert getattr(options, option.name) == params[option.name], option.name
    assert options.out_root == tmp_path and options.no_progress_bar
    assert options.progress_json == tmp_path / "p.jsonl"


@pytest.mark.parametrize(
    ("raw", "field", "words"),
    [
        ({"rounds": 0}, "rounds", "positive integer"),
        ({"rounds": True}, "rounds", "expected an integer"),
        ({"iterations": 2.5}, "iterations", "expected an integer"),
        ({"tp": []}, "tp", "at least one"),
        ({"tp": [1, "x"]}, "tp", "expected an integer"),
        ({"tp": [1, 2], "tp_refresh": [4]}, "tp_refresh", "not in the session"),
        ({"command": "profile", "tp_refresh": [1]}, "tp_refresh", "belongs to slice"),
        ({"dp": [0]}, "dp", "positive"),
        ({"dp": [256]}, "ep", "a rank would own none"),
        ({"grid_factor": 1.0}, "grid_factor", "at least 1.05"),
        ({"dtype": "int4"}, "dtype", "invalid choice"),
        ({"device": None}, "device", "may not be null"),
        ({"hardware": "../x"}, "hardware", "letters"),
        ({"max_num_seqs": 9, "max_num_batched_tokens": 8}, "max_num_seqs", "exceeds"),
    ],
)
def test_it_files_each_error_under_its_field(raw: dict[str, Any], field: str, words: str) -> None:
    """R8: a refused option is named by a typed error, not found in a message."""
    with pytest.raises(OptionErrors) as caught:
        validate_job({"model": QWEN, "hardware": "H200", **raw})
    assert list(caught.value.errors) == [field]
    assert words in " ".join(caught.value.errors[field])


def test_it_refuses_a_model_folder_outside_the_allowed_roots(tmp_path: Path) -> None:
    folder = tmp_path / "models" / "mine"
    folder.mkdir(parents=True)
    with pytest.raises(OptionErrors) as caught:
        validate_job({"model": str(folder), "hardware": "H200"})
    assert "unknown model" in caught.value.errors["model"][0]
    with pytest.raises(OptionErrors) as caught:
        validate_job({"model": str(folder), "hardware": "H200"}, model_roots=[tmp_path / "models"])
    # Allowed now, and read: a folder without config.json is the model's problem.
    assert list(caught.value.errors) == ["model"]
    assert "config.json" in caught.value.errors["model"][0]


def test_it_refuses_what_is_not_an_object_and_unknown_names() -> None:
    with pytest.raises(OptionErrors) as caught:
        validate_job(["model"])
    assert list(caught.value.errors) == [NON_FIELD]
    with pytest.raises(OptionErrors) as caught:
        validate_job({"model": QWEN, "hardware": "H200", "out_root": "/", "force": True})
    assert caught.value.errors == {
        "force": ["unknown parameter"],
        "out_root": ["unknown parameter"],
    }


def test_it_keeps_the_docs_table_equal_to_the_schema() -> None:
    text = (REPO / "docs" / "jobs.md").read_text()
    start = text.index("<!-- options-table")
    start = text.index("\n", start) + 1
    end = text.index("<!-- /options-table -->")
    assert text[start:end] == markdown_table()


def test_it_validates_a_job_without_torch_vllm_or_adapters() -> None:
    code = (
        "import sys\n"
        "from acquisition.options import validate_job\n"
        f"validate_job({{'model': {QWEN!r}, 'hardware': 'H200', 'dp': [2], 'ep': [2]}})\n"
        "bad = [m for m in ('torch', 'vllm', 'acquisition.adapters', 'django') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, check=True, timeout=60)


def test_it_knows_what_each_named_backend_can_measure() -> None:
    """One set of declared rules for the adapters' admission and the registry's requests:
    the live path measures TP1/DP1/EP1 only (R25); the modular path and the reference any
    full-EP rank of an unquantized checkpoint without shared experts."""
    from acquisition.options.measurable import _RULES, MEASURING_BACKENDS, cell_problem

    assert sorted(_RULES) == sorted(MEASURING_BACKENDS)
    cell = {"tp": 1, "dp": 2, "rank": 1, "sequence_parallel": False}
    assert "TP1/DP1/EP1 only (R25)" in (cell_problem("vllm-live", QWEN, **cell) or "")
    assert cell_problem("vllm-live", QWEN, tp=1, dp=1, rank=0, sequence_parallel=False) is None
    assert cell_problem("vllm-modular", QWEN, **cell) is None
    assert cell_problem("torch-reference", QWEN, **cell) is None
    assert "not a backend" in (cell_problem("TRITON", QWEN, **cell) or "")
    assert "not in the acquisition catalog" in (cell_problem("vllm-modular", "x/y", **cell) or "")
    assert "rank" in (cell_problem("vllm-modular", QWEN, **{**cell, "rank": 2}) or "")


def test_it_refuses_a_named_backend_for_a_target_it_cannot_measure() -> None:
    """A job for the live path at DP2 fails validation (field backend), not admission on a
    GPU host after it was queued."""
    with pytest.raises(OptionErrors) as caught:
        validate_job({"model": QWEN, "hardware": "H200", "dp": [2], "backend": "vllm-live"})
    assert list(caught.value.errors) == ["backend"]
    assert "vllm-live cannot measure tp1/dp2_ep2_rank0_sp0" in caught.value.errors["backend"][0]
    validate_job({"model": QWEN, "hardware": "H200", "dp": [2], "backend": "vllm-modular"})
