"""The resumable capture loop: prompts in batches, a checkpoint per batch, one profile at the end.

Checkpoints live in ``<out>.partial/``: ``state.json`` (what is being captured: the prompt
file's sha256, the model, router, batch size, ``max_tokens``, every engine option that can change
what the router sees or how the steps are cut, and the software versions) and one
``batch-NNNNN.npz`` per finished batch (its steps and token counts), written atomically. A rerun
of the same command skips the finished batches; a rerun with anything else changed (another
seed, dtype or weights, another vLLM) refuses, naming what changed, rather than mixing two
captures under one command line. The profile is written when every batch is done, and the
checkpoint folder is removed.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from acquisition.progress import ProgressReporter
from acquisition.routing_capture.engines import Prompt, RoutingEngine
from acquisition.routing_capture.recorder import CaptureError, StepRecorder
from moetables.profiles import RoutingProfile, write_profile

__all__ = ["CaptureError", "run_capture"]


def _partial(out: Path) -> Path:
    return out.with_name(out.name + ".partial")


def _state(
    engine: RoutingEngine,
    prompts_sha256: str,
    prompts: int,
    batch: int,
    max_tokens: int,
    options: Mapping[str, Any],
) -> dict[str, Any]:
    d = engine.describe()
    # JSON round trip: the state is compared with what state.json gives back (tuples, floats).
    identity: dict[str, Any] = json.loads(
        json.dumps({f"option.{k}": v for k, v in options.items()})
    )
    versions = {f"version.{k}": v for k, v in d.versions.items()}
    return (
        identity
        | versions
        | {
            "prompts_sha256": prompts_sha256,
            "prompts": prompts,
            "batch_prompts": batch,
            "max_tokens": max_tokens,
            "model": d.model,
            "global_experts": d.global_experts,
            "top_k": d.top_k,
            "layers": list(d.layers),
            "router": d.router,
        }
    )


def _load_state(folder: Path, want: dict[str, Any]) -> None:
    path = folder / "state.json"
    if not path.exists():
        folder.mkdir(parents=True, exist_ok=True)
        tmp = folder / "state.json.tmp"
        tmp.write_text(json.dumps(want, sort_keys=True))
        tmp.replace(path)
        return
    have = json.loads(path.read_text())
    changed = sorted(k for k in set(have) | set(want) if have.get(k) != want.get(k))
    if changed:
        raise CaptureError(
            f"{folder} holds a capture with different {changed}; remove it to start over"
        )


def _batch_path(folder: Path, index: int) -> Path:
    return folder / f"batch-{index:05d}.npz"


def _save_batch(
    folder: Path, index: int, tokens: Any, counts: Any, prompt_tokens: int, generated: int
) -> None:
    target = _batch_path(folder, index)
    tmp = folder / f".batch-{index:05d}.tmp-{os.getpid()}"
    with tmp.open("wb") as fh:
        np.savez_compressed(
            fh,
            step_tokens=tokens,
            counts=counts,
            workload=np.array([prompt_tokens, generated], dtype=np.int64),
        )
    tmp.replace(target)


def run_capture(
    engine: RoutingEngine,
    prompts: list[Prompt],
    prompts_sha256: str,
    out: Path,
    *,
    max_tokens: int,
    batch_prompts: int,
    command: str,
    source: str,
    progress: ProgressReporter,
    stop_after: int | None = None,
    model_name: str | None = None,
    options: Mapping[str, Any] | None = None,
) -> RoutingProfile | None:
    """Capture every batch not yet checkpointed; write and return the profile when all are
    done. ``stop_after`` batches (tests, or a time-boxed run) stops early and returns None.
    ``model_name`` names the checkpoint in the profile where the folder's name would not (a
    config copied to a temporary folder, dummy weights). ``options`` are the engine settings
    a resume must share (the CLI's ``capture_options``)."""
    description = engine.describe()
    folder = _partial(out)
    _load_state(
        folder,
        _state(engine, prompts_sha256, len(prompts), batch_prompts, max_tokens, options or {}),
    )
    batches = [prompts[i : i + batch_prompts] for i in range(0, len(prompts), batch_prompts)]
    recorder = StepRecorder(list(description.layers), description.global_experts, description.top_k)
    engine.install(recorder.capture)
    done = [i for i in range(len(batches)) if _batch_path(folder, i).exists()]
    progress.skipped(len(done))
    ran = 0
    for index, batch in enumerate(batches):
        if _batch_path(folder, index).exists():
            continue
        if stop_after is not None and ran >= stop_after:
            progress.event(
                "cancelled", f"stopped after {ran} batches (resume with the same command)"
            )
            return None
        started = time.monotonic()
        prompt_tokens, generated = engine.generate(batch, max_tokens)
        tokens, counts = recorder.take()
        if tokens.size == 0:
            raise CaptureError(f"batch {index}: the engine ran, but no router captured a step")
        _save_batch(folder, index, tokens, counts, prompt_tokens, generated)
        ran += 1
        progress.measured(
            time.monotonic() - started,
            f"batch {index + 1}/{len(batches)}: {tokens.size} steps, {int(tokens.sum())} rows",
        )
    all_tokens, all_counts, workload = [], [], np.zeros(2, dtype=np.int64)
    for index in range(len(batches)):
        with np.load(_batch_path(folder, index), allow_pickle=False) as data:
            all_tokens.append(data["step_tokens"])
            all_counts.append(data["counts"])
            workload += data["workload"]
    profile = RoutingProfile.create(
        model={
            "name": model_name or description.model,
            "global_experts": description.global_experts,
            "top_k": description.top_k,
            "layers": list(description.layers),
        },
        workload={
            "prompts_sha256": prompts_sha256,
            "prompts": len(prompts),
            "prompt_tokens": int(workload[0]),
            "generated_tokens": int(workload[1]),
            "max_tokens": max_tokens,
            "batch_prompts": batch_prompts,
        },
        step_tokens=np.concatenate(all_tokens),
        counts=np.concatenate(all_counts),
        versions=description.versions,
        command=command,
        router=description.router,
        source=source,
    )
    write_profile(profile, out)
    for index in range(len(batches)):
        _batch_path(folder, index).unlink()
    (folder / "state.json").unlink()
    folder.rmdir()
    progress.event("done", f"{profile.steps} steps written", profile=str(out))
    return profile
