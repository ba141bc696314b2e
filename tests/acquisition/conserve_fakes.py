"""Shared stand-ins of the ``conserve`` tests: a fake modular path admitted on CPU, a small
real acquisition of it, and ``main`` for the device script's test (``python -m acquisition
conserve`` with these fakes in place of vLLM, the GPU and the profiler)."""

from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path
from typing import Any

import vllm_fakes as fv

from acquisition.adapters.base import Admission, EngineLimits
from acquisition.adapters.vllm_modular_backend import VllmModularBackend
from acquisition.progress import ProgressReporter

LIMITS = EngineLimits(max_num_batched_tokens=4, max_num_seqs=2)


class Admitting(VllmModularBackend):
    """The fake modular path admitted on CPU (its real admission asks for CUDA)."""

    def __init__(self, *, traced: bool = True, fail_rank: int | None = None) -> None:
        super().__init__(
            resolve=fv.resolver(fv.modular_namespace()),
            activities=fv.activities,
            trace=fv.trace if traced else None,
        )
        self.fail_rank = fail_rank
        self.built: list[str] = []

    def admit(self, model: Any, target: Any, runtime: Any) -> Admission:
        return Admission.accept(self.name)

    def build(self, model: Any, target: Any, runtime: Any, dtype: str) -> Any:
        if target.dp > 1 and target.rank == self.fail_rank:
            raise RuntimeError("the device fell over")
        self.built.append(target.deployment)
        assert runtime.limits.max_num_batched_tokens == 4  # the contract's limits, not a guess
        return super().build(model, target, runtime, dtype)


def acquire(model_dir: Path, out: Path, *, traced: bool) -> Path:
    """A small real acquisition (DP1 and DP2 ranks 0, 1) of the fake modular path."""
    from acquisition.acquire import acquire_target
    from acquisition.adapters import AdmissionReport
    from acquisition.cli import build_parser
    from acquisition.options import from_namespace, prepare

    args = [
        "slice", str(model_dir), "--hardware", "CPU-TEST", "--tp-refresh", "1", "--dp", "1,2",
        "--max-num-seqs", "2", "--max-num-batched-tokens", "4", "--moe-rounds", "1",
        "--measurement-iterations", "1", "--warmup-cycles", "0", "--backend", "vllm-modular",
        "--device", "cpu", "--cache-bytes", "1", "--quality-tolerance", "0.9",
        "--cudagraph-mode", "NONE", "--no-progress-bar", "--out-root", str(out),
    ]  # fmt: skip
    request, plans = prepare(from_namespace(build_parser().parse_args(args)), "")
    backend = Admitting(traced=traced)
    runtime = fv.fake_runtime(limits=LIMITS)
    progress = ProgressReporter(None, bar=False, total=0)
    try:
        for plan in plans:
            report = AdmissionReport(plan.target, backend.name, (Admission.accept(backend.name),))
            few = [next(p for p in plan.points if p.component == c) for c in plan.components]
            small = dataclasses.replace(plan, points=tuple(few))
            assert acquire_target(request, small, backend, runtime, report, progress).published
    finally:
        progress.close()
    return request.bundle_dir


def main(argv: list[str]) -> int:
    """``conserve ARGS`` as the CLI runs it, with the fakes; ``STUB_GPU`` names another GPU."""
    from acquisition.cli import build_parser
    from acquisition.conserve import ConserveError, plan_targets, run

    args = build_parser().parse_args(["conserve", *argv])
    try:
        targets = plan_targets(args.bundles, only=args.target, replace=args.replace)
    except ConserveError as exc:
        print(exc, file=sys.stderr)
        return 2
    runtime = fv.fake_runtime()
    if os.environ.get("STUB_GPU"):
        runtime = dataclasses.replace(runtime, device_name=os.environ["STUB_GPU"])
    backend = Admitting()
    progress = ProgressReporter(args.progress_json, bar=False, total=len(targets))
    try:
        _written, failures = run(
            targets,
            out=args.out,
            replace_rows=args.replace,
            command_line="python -m acquisition conserve " + " ".join(argv),
            progress=progress,
            backend_for=lambda name: backend,
            probe=lambda device: runtime,
            vllm_version=lambda: None,
        )
    finally:
        progress.close()
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
