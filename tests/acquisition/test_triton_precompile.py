"""Triton precompilation before the measuring loop (issue 19), on CPU with a Triton stand-in.

``vllm_fakes.FakeJit`` keys, compiles and launches like a Triton ``JITFunction`` (``kernel[grid]``
launches; ``run(..., warmup=True)`` compiles only), and ``FakeAsyncCompileMode`` hands the
compilations to a pool as Triton's ``AsyncCompileMode`` does. What must hold: the compilations
move out of the points (into the ``precompile`` phase), run side by side when the async mode is
there, and every point's forwards are exactly those of a run without precompilation (R17-R19:
the same reference checks, warmups and timed forwards, the same kernel launches).
"""

from __future__ import annotations

import dataclasses
import json
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import vllm_fakes as fv
from tiny_moe import write_model

from acquisition.adapters import Admission, AdmissionReport
from acquisition.adapters.triton_precompile import (
    ASYNC_COMPILE_MODE,
    TRITON_KERNELS,
    cached_kernels,
    launches_compiled_only,
    precompile,
)
from acquisition.adapters.vllm_modular_backend import VllmModularBackend
from acquisition.phases import PHASES, PhaseClock
from acquisition.progress import ProgressReporter


@pytest.fixture
def jit() -> Any:
    kernel = fv.FakeJit()
    fv.JIT_KERNELS.append(kernel)
    yield kernel
    fv.JIT_KERNELS.remove(kernel)


def _forwards(kernel: Any, rows: list[int]) -> list[tuple[int, Any]]:
    return [(r, lambda r=r: kernel[(r,)](r % 16 == 0, BLOCK_SIZE_M=r)) for r in rows]


def test_inside_the_patch_a_launch_compiles_and_runs_nothing(jit: Any) -> None:
    with launches_compiled_only([jit]):
        jit[(1,)](True, BLOCK_SIZE_M=16)
        assert "run" in vars(jit)
    assert "run" not in vars(jit)  # the instance patch is gone
    assert jit.launched == []
    assert [warm for _, warm, _ in jit.compiles] == [True]
    jit[(1,)](True, BLOCK_SIZE_M=16)  # the measured launch finds it compiled
    assert len(jit.compiles) == 1 and len(jit.launched) == 1


def test_the_patch_is_removed_after_an_error_and_never_stacked(jit: Any) -> None:
    with pytest.raises(ValueError), launches_compiled_only([jit]):
        raise ValueError("boom")
    assert "run" not in vars(jit)
    with launches_compiled_only([jit]), pytest.raises(RuntimeError, match="already patched"):  # noqa: SIM117
        with launches_compiled_only([jit]):
            pass
    assert "run" not in vars(jit)


def test_parallel_mode_compiles_side_by_side_on_pool_threads(jit: Any) -> None:
    # Each compilation waits for a second one to be running: only concurrency gets through.
    barrier = threading.Barrier(2, timeout=10)
    jit.compile_wait = barrier.wait
    report = precompile(
        [("fused_moe_kernel", jit)],
        _forwards(jit, [512, 256, 64, 32]),
        workers=4,
        async_mode=fv.FakeAsyncCompileMode,
        synchronize=lambda: None,
    )
    assert report.mode == "parallel" and report.workers == 4
    assert report.compiled == 4 == cached_kernels(jit)
    main = threading.get_ident()
    assert all(warm and thread != main for _, warm, thread in jit.compiles)
    assert jit.launched == []  # nothing ran on the device


def test_without_an_async_mode_it_compiles_serially_outside_the_points(jit: Any) -> None:
    report = precompile(
        [("fused_moe_kernel", jit)],
        _forwards(jit, [32, 16, 32]),
        workers=8,
        async_mode=None,
        synchronize=lambda: None,
    )
    assert (report.mode, report.workers, report.compiled) == ("serial", 1, 2)
    assert all(warm for _, warm, _ in jit.compiles)


def test_an_async_mode_that_fails_falls_back_to_serial(jit: Any) -> None:
    class Broken:
        def __init__(self, executor: Any) -> None:
            pass

        def __enter__(self) -> None:
            raise RuntimeError("Another AsyncCompileMode is already active")

        def __exit__(self, *exc: object) -> None:
            pass

    report = precompile(
        [("fused_moe_kernel", jit)],
        _forwards(jit, [64, 128]),
        workers=4,
        async_mode=Broken,
        synchronize=lambda: None,
    )
    assert report.mode == "serial" and report.compiled == 2
    assert "already active" in report.fallback[0]


def test_a_dry_forward_that_raises_never_fails_the_target(jit: Any) -> None:
    def broken() -> None:
        raise RuntimeError("no such specialisation")

    report = precompile(
        [("fused_moe_kernel", jit)],
        [(64, broken)],
        workers=4,
        async_mode=fv.FakeAsyncCompileMode,
        synchronize=lambda: None,
    )
    assert report.mode == "failed" and report.workers == 0
    assert [f.split(":")[0] for f in report.fallback] == ["RuntimeError", "RuntimeError"]
    assert "run" not in vars(jit)


def test_nothing_to_compile_with_is_said_not_raised() -> None:
    report = precompile([], [(4, lambda: None)], workers=8, async_mode=None, synchronize=print)
    assert report.mode == "none" and "no Triton expert kernel" in report.reason


def test_the_phase_and_its_note_are_in_the_phase_log(tmp_path: Path) -> None:
    assert "precompile" in PHASES
    clock = PhaseClock(tmp_path / "phases.jsonl")
    clock.set_target("t")
    with clock.phase("precompile"):
        clock.note("precompile", {"mode": "parallel"})
    record = clock.write()
    assert record is not None
    assert record["targets"]["t"]["notes"] == {"precompile": {"mode": "parallel"}}
    assert record["targets"]["t"]["counts"] == {"precompile": 1}


# -- through the acquisition: the same forwards, the compilations moved -----------------------


def _acquire(tmp_path: Path, workers: int, jit: Any) -> tuple[Path, PhaseClock]:
    from acquisition.acquire import acquire_target
    from acquisition.adapters.base import EngineLimits
    from acquisition.cli import build_parser, from_namespace, prepare

    model = write_model(tmp_path / "tiny", num_experts=8)
    out = tmp_path / f"out-{workers}"
    args = [
        "slice",
        str(model),
        "--hardware",
        "cpu-test",
        "--tp-refresh",
        "1",
        "--dp",
        "1,2",
        "--max-num-batched-tokens",
        "48",
        "--max-num-seqs",
        "4",
        "--moe-rounds",
        "1",
        "--measurement-iterations",
        "1",
        "--backend",
        "vllm-modular",
        "--device",
        "cpu",
        "--cache-bytes",
        "1",
        "--quality-tolerance",
        "0.9",
        "--cudagraph-mode",
        "NONE",
        "--no-progress-bar",
        "--triton-precompile-workers",
        str(workers),
        "--out-root",
        str(out),
    ]
    request, plans = prepare(from_namespace(build_parser().parse_args(args)), "")
    namespace = fv.modular_namespace(
        **{TRITON_KERNELS["fused_moe_kernel"]: jit, ASYNC_COMPILE_MODE: fv.FakeAsyncCompileMode}
    )
    backend = VllmModularBackend(resolve=fv.resolver(namespace), activities=fv.activities)
    runtime = fv.fake_runtime(limits=EngineLimits(max_num_batched_tokens=48, max_num_seqs=4))
    progress = ProgressReporter(None, bar=False, total=0)
    clock = PhaseClock(tmp_path / f"phases-{workers}.jsonl")
    try:
        for plan in plans:
            # One point of each local component, and expert points of several row counts.
            local = [next(p for p in plan.points if p.component == c) for c in plan.components]
            rows = sorted({p.tokens for p in plan.points if p.is_expert})[::3]
            experts = [next(p for p in plan.points if p.is_expert and p.tokens == r) for r in rows]
            points = {p.key: p for p in (*local, *experts)}
            small = dataclasses.replace(plan, points=tuple(points.values()))
            report = AdmissionReport(plan.target, "vllm-modular", (Admission.accept(backend.name),))
            assert acquire_target(
                request, small, backend, runtime, report, progress, clock=clock
            ).published
    finally:
        progress.close()
    return out, clock


def _forward_records(out: Path) -> list[tuple[Any, ...]]:
    """Per target and point: every context's arm, round, forwards and sets (not the times)."""
    found = []
    for samples in sorted(out.rglob("samples.jsonl")):
        for line in samples.read_text().splitlines():
            record = json.loads(line)
            if record["type"] == "context":
                found.append(
                    (samples.parent.name, record["point"], record["arm"], record["round"],
                     record["forwards"], record["sets"])
                )  # fmt: skip
            elif record["type"] == "reference_check":
                found.append((samples.parent.name, record["point"], "check", record["slots"]))
    # A point whose B/2B control failed on this loaded CPU is measured again at the end of the
    # queue (the same contexts once more): timing noise, not what precompilation changes.
    return list(dict.fromkeys(found))


def test_precompiled_acquisition_runs_the_same_forwards_with_no_compile_inside_points(
    tmp_path: Path,
) -> None:
    """R17-R19 unchanged: the same contexts, forwards, weight sets and reference checks, the
    same kernel launches in the same order; only where the compilations happen moves."""
    cold, warm = fv.FakeJit(), fv.FakeJit()
    fv.JIT_KERNELS.append(cold)
    try:
        out_cold, _ = _acquire(tmp_path / "a", 0, cold)
    finally:
        fv.JIT_KERNELS.remove(cold)
    fv.JIT_KERNELS.append(warm)
    try:
        out_warm, clock = _acquire(tmp_path / "b", 8, warm)
    finally:
        fv.JIT_KERNELS.remove(warm)

    assert _forward_records(out_cold) == _forward_records(out_warm) != []
    assert cold.launched == warm.launched  # every measured launch, in order
    # Both compile the same kernels. Off: by launches (the build's traced forwards, then the
    # points'). On: what the build did not compile is compiled before the loop, on pool
    # threads, and once that started no launch compiled anything.
    assert Counter(k for k, _, _ in warm.compiles) == Counter(k for k, _, _ in cold.compiles)
    assert not any(warmup for _, warmup, _ in cold.compiles)
    kinds = [kind for kind, _ in warm.events]
    assert "precompile" in kinds
    assert "compile" not in kinds[kinds.index("precompile") :]
    assert all(thread != threading.get_ident() for _, warmup, thread in warm.compiles if warmup)
    # The builds are identical, so what the warm run precompiled the cold run compiled by a
    # launch inside a point: the compilations that moved.
    moved = {k for k, warmup, _ in warm.compiles if warmup}
    assert moved and moved <= {k for k, _, _ in cold.compiles}

    record = clock.record()
    for target, entry in record["targets"].items():
        if target == "run":
            continue
        note = entry["notes"]["precompile"]
        assert note["mode"] == "parallel" and note["rows"] >= 1, target
        assert entry["counts"]["precompile"] == 1
        assert note["configs"] is None  # cpu-test: the kernel's configuration is not modelled


def test_the_live_session_precompiles_through_the_engines_kernel(jit: Any, tmp_path: Path) -> None:
    """vllm-live: one dry ``FusedMoEKernel.apply`` per stimulus on the engine's own weights,
    compiled and not launched; the measured forward then finds its kernel compiled."""
    from acquisition.adapters.base import EngineLimits
    from acquisition.adapters.vllm_capabilities import LIVE_SYMBOLS, probe_surface
    from acquisition.adapters.vllm_live import VllmLiveSession
    from acquisition.catalog import resolve_model
    from acquisition.protocol.stimulus import routing_stimulus
    from moetables.geometry import ExpertGeometry, MoeTarget, linear_expert_map

    folder = write_model(
        tmp_path / "tiny", architectures=["Qwen3MoeForCausalLM"], num_hidden_layers=4,
        max_position_embeddings=512,
    )  # fmt: skip
    model = resolve_model(str(folder))
    target = MoeTarget(tp=1, dp=1, ep=1, rank=0, sequence_parallel=False)
    namespace = {
        TRITON_KERNELS["fused_moe_kernel"]: jit,
        ASYNC_COMPILE_MODE: fv.FakeAsyncCompileMode,
    }
    resolve = fv.resolver(fv.live_namespace(**namespace))
    limits = EngineLimits(max_num_batched_tokens=64, max_num_seqs=16, kv_cache_memory_bytes=1 << 30)
    live = VllmLiveSession(
        model, target, fv.fake_runtime(), "float32", limits, probe_surface(LIVE_SYMBOLS, resolve),
        check_ownership=False, resolve=resolve,
    )  # fmt: skip
    try:
        geometry = ExpertGeometry.for_target(model.global_experts, model.top_k, target)
        mapping = linear_expert_map(model.global_experts, 1, 0)
        stimuli = [routing_stimulus(geometry, mapping, n, 2, 2 * n, seed=n) for n in (32, 4)]
        compiled_before = len(jit.compiles)
        report = live.precompile(stimuli, 4)
        assert report.mode == "parallel" and report.kernels == ("fused_moe_kernel",)
        assert report.rows == (32, 4)
        new = jit.compiles[compiled_before:]
        assert new and all(warmup for _, warmup, _ in new)
        launched = len(jit.launched)
        live.allocate_banks(2)
        live.run_experts(live.prepare_experts(stimuli[0]), 0)
        assert len(jit.launched) == launched + 1 and len(jit.compiles) == compiled_before + len(new)
    finally:
        live.close()


def test_the_phase_table_names_what_each_target_precompiled(tmp_path: Path) -> None:
    from bench.acquisition_phases import load, precompile_notes

    clock = PhaseClock(tmp_path / "phases.jsonl")
    clock.set_target("tp1/dp1_ep1_rank0_sp0")
    with clock.phase("precompile"):
        clock.note(
            "precompile",
            {"mode": "parallel", "workers": 8, "rows": 41, "configs": 9, "compiled": 18,
             "seconds": 2.5, "fallback": []},
        )  # fmt: skip
    clock.write()
    run = load(tmp_path / "phases.jsonl", "after")
    assert run.seconds["precompile"] >= 0
    assert precompile_notes([run]) == (
        "Triton precompilation:\n- after tp1/dp1_ep1_rank0_sp0: parallel, 8 workers, "
        "41 row counts, 9 configurations, 18 kernels compiled, 2.5 s"
    )
    assert precompile_notes([load(tmp_path / "phases.jsonl", "x")][:0]) == ""


def test_the_async_mode_is_found_where_triton_defines_it_too(jit: Any) -> None:
    from acquisition.adapters.triton_precompile import precompile_stimuli
    from acquisition.protocol.stimulus import RoutingStimulus

    namespace = {
        TRITON_KERNELS["fused_moe_kernel"]: jit,
        "triton.runtime._async_compile:AsyncCompileMode": fv.FakeAsyncCompileMode,
    }
    stimulus = RoutingStimulus(4, 1, 4, None, None)  # type: ignore[arg-type]
    report = precompile_stimuli(
        fv.resolver(namespace),
        [stimulus],
        lambda s: jit[(s.tokens,)](s.tokens % 16 == 0, BLOCK_SIZE_M=16),
        workers=2,
        synchronize=lambda: None,
    )
    assert (report.mode, report.rows, report.compiled) == ("parallel", (4,), 1)
    nothing = precompile_stimuli(None, [stimulus], print, workers=2, synchronize=lambda: None)
    assert nothing.mode == "none"
