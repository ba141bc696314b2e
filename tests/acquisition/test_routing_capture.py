"""R41 (captured routing, issue 15 part 1): ``python -m acquisition routing`` through the torch
engine: the router hook, the per-step counts, resume and progress."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from acquisition.routing_capture.cli import main
from acquisition.routing_capture.engines import PromptError, read_prompts
from acquisition.routing_capture.recorder import CaptureError, StepRecorder
from moetables.profiles import read_profile
from tests.acquisition.routing_fixtures import write_prompts, write_tiny_moe


def _argv(tmp: Path, *extra: str) -> list[str]:
    folder = write_tiny_moe(tmp / "model")
    prompts = write_prompts(tmp / "prompts.jsonl")
    return [
        str(folder),
        "--prompts",
        str(prompts),
        "--engine",
        "torch",
        "--max-tokens",
        "4",
        "--batch-prompts",
        "4",
        "--out",
        str(tmp / "p.routing.npz"),
        "--no-progress-bar",
        "--progress-json",
        str(tmp / "progress.jsonl"),
        *extra,
    ]


def test_it_captures_every_layer_of_every_step_prefill_and_decode(tmp_path: Path) -> None:
    assert main(_argv(tmp_path)) == 0
    profile = read_profile(tmp_path / "p.routing.npz")
    # 13 prompts in batches of 4 (4, 4, 4, 1): one prefill and 3 decode steps per batch.
    assert profile.steps == 4 * 4
    assert profile.layers == [0, 1, 2]
    decode = profile.step_tokens.reshape(4, 4)[:, 1:]
    assert (decode == np.array([[4], [4], [4], [1]])).all()
    # Every step's layer adds up to tokens x top-k (checked by the reader, asserted here too).
    assert (profile.counts.sum(axis=2) == profile.step_tokens[:, None] * 4).all()
    meta = profile.meta
    assert meta["workload"]["prompts"] == 13
    assert meta["workload"]["prompt_tokens"] == int(profile.step_tokens.reshape(4, 4)[:, 0].sum())
    assert meta["workload"]["generated_tokens"] == 13 * 4
    assert meta["command"].startswith("python -m acquisition routing ")
    assert meta["source"] == "torch" and "zipf" in meta["router"]
    # The synthetic gate is skewed: the busiest expert carries well above the mean.
    assert profile.imbalance().min() > 1.5
    events = [json.loads(line) for line in (tmp_path / "progress.jsonl").read_text().splitlines()]
    assert events[-1]["phase"] == "done" and events[-1]["points_done"] == 4
    assert not (tmp_path / "p.routing.npz.partial").exists()


def test_it_resumes_from_its_checkpoints_with_the_same_result(tmp_path: Path) -> None:
    whole = tmp_path / "whole"
    assert main(_argv(whole)) == 0
    parts = tmp_path / "parts"
    assert main(_argv(parts, "--stop-after", "2")) == 130
    assert len(list((parts / "p.routing.npz.partial").glob("batch-*.npz"))) == 2
    assert main(_argv(parts)) == 0
    events = [json.loads(line) for line in (parts / "progress.jsonl").read_text().splitlines()]
    assert any("resumed: 2" in e["message"] for e in events)
    a, b = read_profile(whole / "p.routing.npz"), read_profile(parts / "p.routing.npz")
    assert np.array_equal(a.counts, b.counts) and np.array_equal(a.step_tokens, b.step_tokens)


def test_it_refuses_to_resume_a_different_capture(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(_argv(tmp_path, "--stop-after", "1")) == 130
    assert main(_argv(tmp_path, "--max-tokens", "5")) == 1
    assert "different ['max_tokens']" in capsys.readouterr().err


def test_it_refuses_to_resume_with_another_seed_or_router(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Another seed is another model (dummy or synthetic weights): the stopped capture's
    batches and the new ones must not end in one profile under the new command line."""
    assert main(_argv(tmp_path, "--stop-after", "1")) == 130
    assert main(_argv(tmp_path, "--seed", "7")) == 1
    assert "different ['option.seed']" in capsys.readouterr().err
    assert main(_argv(tmp_path, "--zipf-s", "2.0")) == 1
    assert "different ['option.zipf_s', 'router']" in capsys.readouterr().err
    assert len(list((tmp_path / "p.routing.npz.partial").glob("batch-*.npz"))) == 1


def test_it_resumes_whatever_the_progress_output(tmp_path: Path) -> None:
    """Where progress goes is not part of what is captured."""
    assert main(_argv(tmp_path, "--stop-after", "1")) == 130
    argv = _argv(tmp_path)
    argv[argv.index("--progress-json") + 1] = str(tmp_path / "other.jsonl")
    assert main(argv) == 0
    assert read_profile(tmp_path / "p.routing.npz").steps == 16


def test_it_refuses_to_resume_under_other_software(tmp_path: Path) -> None:
    """A capture resumed by another torch or vLLM would record one version for both halves."""
    from acquisition.progress import ProgressReporter
    from acquisition.routing_capture.capture import run_capture
    from acquisition.routing_capture.torch_engine import TorchRoutingEngine

    folder = write_tiny_moe(tmp_path / "model")
    prompts, digest = read_prompts(write_prompts(tmp_path / "prompts.jsonl"))
    engine = TorchRoutingEngine(folder, zipf_s=1.2, layers=None, seed=0)

    def capture(stop_after: int | None) -> object:
        return run_capture(
            engine, prompts, digest, tmp_path / "p.routing.npz", max_tokens=2,
            batch_prompts=4, command="test", source="torch",
            progress=ProgressReporter(None, bar=False, total=4), stop_after=stop_after,
        )  # fmt: skip

    assert capture(1) is None
    state = tmp_path / "p.routing.npz.partial" / "state.json"
    saved = json.loads(state.read_text())
    versioned = [k for k in saved if k.startswith("version.")]
    assert versioned  # the engine's versions are part of the identity
    state.write_text(json.dumps({**saved, versioned[0]: "0.0.0-other"}))
    with pytest.raises(CaptureError, match=f"different \\['{versioned[0]}'\\]"):
        capture(None)


def test_it_names_a_bad_command_before_starting_an_engine(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt_token_ids": [1, -2]}\n')
    folder = write_tiny_moe(tmp_path / "model")
    argv = [str(folder), "--prompts", str(bad), "--engine", "torch", "--max-tokens", "0"]
    assert main([*argv, "--model-name", ""]) == 2
    err = capsys.readouterr().err
    assert "bad.jsonl:1: prompt_token_ids" in err and "--max-tokens" in err
    assert "--model-name must be 1 to 200 characters" in err
    with pytest.raises(PromptError, match="no prompts"):
        (tmp_path / "empty").write_text("\n\n")
        read_prompts(tmp_path / "empty")


def test_it_refuses_a_capture_that_does_not_add_up() -> None:
    rec = StepRecorder([0, 1], 4, 2)
    rec.capture(0, 3, np.array([2, 2, 1, 1]))
    with pytest.raises(CaptureError, match="layer 1 saw 2 tokens"):
        rec.capture(1, 2, np.array([1, 1, 1, 1]))
    rec = StepRecorder([0, 1], 4, 2)
    rec.capture(0, 3, np.array([2, 2, 1, 1]))
    with pytest.raises(CaptureError, match=r"layers \[1\] captured nothing"):
        rec.capture(0, 3, np.array([2, 2, 1, 1]))
    with pytest.raises(CaptureError, match="add up to 5"):
        StepRecorder([0], 4, 2).capture(0, 3, np.array([2, 1, 1, 1]))
    with pytest.raises(CaptureError, match="exceed"):
        StepRecorder([0], 4, 2).capture(0, 2, np.array([3, 1, 0, 0]))


def test_it_feeds_the_captured_policy_with_the_captured_statistics(tmp_path: Path) -> None:
    """Issue 15 part 3 on the tiny torch MoE with the Zipf gate: at the captured prefill and
    decode sizes, the captured policy's per-rank (A, M) are the profile's (same support, means
    within sampling error)."""
    from moetables.routing import Deployment, route_batch

    assert main(_argv(tmp_path)) == 0
    profile = read_profile(tmp_path / "p.routing.npz")
    d = Deployment(1, 4, False, 16, 4)
    stats = profile.rank_statistics(4, layer=1)
    for n in (4, int(profile.step_tokens[0])):
        got = route_batch(d, [[n - 3, 1, 1, 1]] * 300, "captured", profile=profile, layer=1)
        at = stats.tokens == n
        want = {tuple(r) for r in stats.local_assignments[at]}
        assert {tuple(r) for r in got.local_assignments} <= want
        spread = stats.local_assignments[at].std(axis=0) + 0.5
        assert (
            abs(got.local_assignments.mean(axis=0) - stats.local_assignments[at].mean(axis=0))
            < 4 * spread / np.sqrt(min(300, at.sum())) + 0.5
        ).all()


def test_it_finds_routers_that_are_not_modules() -> None:
    """vLLM's MoERunner holds its router as an attribute; the hook must reach it per layer."""
    import torch

    from acquisition.routing_capture.engines import find_routers

    class Router:  # a plain object, as FusedTopKRouter may be
        def set_capture_fn(self, fn: object) -> None:
            self.fn = fn

    class Runner(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.router = Router()

    model = torch.nn.Module()
    model.model = torch.nn.Module()
    model.model.layers = torch.nn.ModuleList(torch.nn.Module() for _ in range(3))
    for i in (0, 2):
        model.model.layers[i].mlp = torch.nn.Module()
        model.model.layers[i].mlp.experts = Runner()
    found = find_routers(model)
    assert sorted(found) == [0, 2]
    assert found[2] is model.model.layers[2].mlp.experts.router


class _FakeOutput:
    def __init__(self, prompt: list[int], generated: list[int]) -> None:
        self.prompt_token_ids = prompt
        self.outputs = [type("Completion", (), {"token_ids": generated})()]


def _fake_vllm(model_dir: Path) -> object:
    """A stand-in ``vllm`` module: ``LLM`` runs the torch engine's MoE (vLLM's module layout
    under ``model.model``) in-process, the way the kit runs vLLM with multiprocessing off."""
    import types

    import torch

    from acquisition.routing_capture.torch_engine import TorchRoutingEngine

    class LLM:
        def __init__(self, model: str, **kwargs: object) -> None:
            assert kwargs["enforce_eager"] is True
            self.kwargs = kwargs
            self.wrapper = torch.nn.Module()
            self.wrapper.model = TorchRoutingEngine(Path(model), zipf_s=1.5).model

        def apply_model(self, fn: object) -> list[object]:
            return [fn(self.wrapper)]  # type: ignore[operator]

        def generate(self, inputs: list[object], params: object, use_tqdm: bool) -> list[object]:
            net = self.wrapper.model
            ids = [list(p["prompt_token_ids"]) for p in inputs]  # type: ignore[index]
            steps = params.max_tokens  # type: ignore[attr-defined]
            with torch.no_grad():
                logits = net(torch.tensor([t % net.vocab for p in ids for t in p]))
                ends = torch.tensor([len(p) for p in ids]).cumsum(0) - 1
                last = logits[ends].argmax(dim=-1)
                new = [[int(t)] for t in last]
                for _ in range(steps - 1):
                    last = net(last).argmax(dim=-1)
                    for row, t in zip(new, last, strict=True):
                        row.append(int(t))
            return [_FakeOutput(p, g) for p, g in zip(ids, new, strict=True)]

    class SamplingParams:
        def __init__(self, max_tokens: int, **_: object) -> None:
            self.max_tokens = max_tokens

    module = types.ModuleType("vllm")
    module.__version__ = "0.26.0-fake"  # type: ignore[attr-defined]
    module.LLM = LLM  # type: ignore[attr-defined]
    module.SamplingParams = SamplingParams  # type: ignore[attr-defined]
    return module


def test_it_captures_through_the_vllm_engine_seam(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The vLLM engine's own code (router hook counting on the device, drained after each
    generate, the output accounting) against an in-process stand-in for vLLM."""
    import sys

    folder = write_tiny_moe(tmp_path / "model")
    monkeypatch.setitem(sys.modules, "vllm", _fake_vllm(folder))
    # Recorded so that the engine's own settings are undone after the test.
    monkeypatch.setenv("VLLM_MOE_ROUTING_SIMULATION_STRATEGY", "unset-by-the-test")
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(
        "".join(
            json.dumps({"prompt_token_ids": list(range(5 + i, 20 + 3 * i))}) + "\n"
            for i in range(6)
        )
    )
    out = tmp_path / "v.routing.npz"
    argv = [
        str(folder),
        "--prompts",
        str(prompts),
        "--engine",
        "vllm",
        "--router",
        "normal_routing",
        "--model-name",
        "Qwen/Qwen3-30B-A3B-Instruct-2507",
        "--max-tokens",
        "3",
        "--batch-prompts",
        "4",
        "--out",
        str(out),
        "--no-progress-bar",
    ]
    assert main(argv) == 0
    import os

    assert os.environ["VLLM_MOE_ROUTING_SIMULATION_STRATEGY"] == "normal_routing"
    profile = read_profile(out)
    assert profile.meta["versions"]["vllm"] == "0.26.0-fake"
    assert profile.meta["router"] == "vllm simulator normal_routing"
    # The name given, not the (temporary) model folder's: the H200 capture copies the config.
    assert profile.meta["model"]["name"] == "Qwen/Qwen3-30B-A3B-Instruct-2507"
    # Batches of 4 and 2 prompts: a prefill, then 2 decode steps each.
    assert profile.step_tokens.tolist()[1:3] == [4, 4] and profile.step_tokens.tolist()[4:] == [
        2,
        2,
    ]
    assert profile.meta["workload"]["generated_tokens"] == 6 * 3
    assert profile.meta["workload"]["prompt_tokens"] == int(profile.step_tokens[[0, 3]].sum())


def test_it_names_engine_option_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = _argv(tmp_path)
    assert main([*argv, "--hf-overrides", "{not json"]) == 2
    assert "--hf-overrides must be a JSON object" in capsys.readouterr().err
    assert main([*argv, "--tensor-parallel-size", "2"]) == 2
    assert "capture at TP1" in capsys.readouterr().err


def test_it_refuses_text_prompts_for_dummy_weights_before_starting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Dummy weights start vLLM without a tokenizer: text prompts would fail only once the
    engine is up (a minute of GPU), so the command names them first."""
    import sys

    folder = write_tiny_moe(tmp_path / "model")
    monkeypatch.setitem(sys.modules, "vllm", _fake_vllm(folder))
    prompts = write_prompts(tmp_path / "prompts.jsonl")  # one plain text line among ids
    argv = [str(folder), "--prompts", str(prompts), "--engine", "vllm"]
    assert main([*argv, "--load-format", "dummy", "--out", str(tmp_path / "x.npz")]) == 2
    err = capsys.readouterr().err
    assert "1 text prompts, but --load-format dummy runs without a tokenizer" in err
    assert not (tmp_path / "x.npz.partial").exists()
