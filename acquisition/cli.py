"""``python -m acquisition profile|slice MODEL ...``: the seed's interface (R6-R9).

Everything that can be wrong with a command (unknown model, unmatched TP/DP/EP degrees, bad
limits, an undeclared sequence-parallel wrapper) is reported before torch is imported or any
device is touched. ``--dry-run`` stops after planning and prints the point counts, so a
registry can validate a job without a GPU.

Exit status: 0 published, 1 acquisition failed (evidence kept), 2 invalid command,
3 no adapter admitted a target, 130 cancelled (SIGINT or SIGTERM; samples kept for resume).
"""

from __future__ import annotations

import argparse
import shlex
import signal
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from acquisition.catalog import CatalogError, catalog_models, resolve_model, variant_for_dtype
from acquisition.deployments import DegreeError, select_deployments, targets_for
from acquisition.phases import PhaseClock
from acquisition.plan import (
    CaptureSizes,
    CudagraphMode,
    PointPlan,
    build_plan,
    derived_capture_sizes,
)
from acquisition.plan.grid import MINIMUM_FACTOR
from acquisition.progress import ProgressReporter
from acquisition.protocol.measure import ProtocolSettings
from acquisition.request import AcquisitionRequest
from moetables.bundle import EXPERTS
from moetables.geometry import ExpertGeometry, MoeTarget

if TYPE_CHECKING:
    from collections.abc import Sequence
    from types import FrameType

__all__ = ["build_parser", "main", "prepare"]

EXIT_FAILED = 1
EXIT_INVALID = 2
EXIT_DECLINED = 3
EXIT_CANCELLED = 130


def _int_list(text: str) -> list[int]:
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers, got {text!r}"
        ) from None
    if not values:
        raise argparse.ArgumentTypeError("expected at least one integer")
    return values


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def _factor(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not value >= MINIMUM_FACTOR:
        raise argparse.ArgumentTypeError(f"the grid factor must be at least {MINIMUM_FACTOR}")
    return value


def build_parser() -> argparse.ArgumentParser:
    from acquisition.adapters import backend_names

    parser = argparse.ArgumentParser(
        prog="python -m acquisition",
        description="Measure native MoE components into a moetables bundle.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="profile|slice")
    for name, help_text in (
        ("profile", "acquire the MoE components of every --tp degree"),
        ("slice", "refresh only the MoE category of the --tp-refresh degree"),
    ):
        sub = commands.add_parser(name, help=help_text)
        sub.add_argument(
            "model", help=f"catalog id ({', '.join(catalog_models())}) or a folder with config.json"
        )
        sub.add_argument(
            "--hardware", required=True, help="hardware label of the bundle, e.g. H200"
        )
        sub.add_argument(
            "--tp", type=_int_list, default=[1], help="session TP degrees; must include 1"
        )
        sub.add_argument(
            "--tp-refresh", type=_int_list, default=None, help="slice: TP degree(s) to measure"
        )
        sub.add_argument("--group", choices=["moe"], default="moe", help="the category to acquire")
        sub.add_argument("--dp", type=_int_list, default=[1], help="target DP degrees (default 1)")
        sub.add_argument(
            "--ep", type=_int_list, default=None, help="filter over the full-EP targets TP x DP"
        )
        sub.add_argument("--max-num-batched-tokens", type=_positive, default=2048)
        sub.add_argument("--max-num-seqs", type=_positive, default=256)
        sub.add_argument(
            "--moe-rounds", type=_positive, default=3, help="independent contexts per point"
        )
        sub.add_argument(
            "--measurement-iterations",
            type=_positive,
            default=3,
            help="minimum timed forwards per context",
        )
        sub.add_argument(
            "--moe-grid-factor",
            type=_factor,
            default=2.0,
            help="ratio between neighbouring grid points (default 2)",
        )
        sub.add_argument(
            "--out-root",
            type=Path,
            required=True,
            help="bundles go to OUT/<hardware>/<model>/<variant>; samples to OUT/_acquisition",
        )
        sub.add_argument("--backend", choices=backend_names(), default="auto")
        sub.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
        sub.add_argument(
            "--dtype",
            choices=["auto", "bfloat16", "float16", "float32"],
            default="auto",
            help="weight and activation dtype (auto: the config's torch_dtype)",
        )
        sub.add_argument(
            "--cudagraph-mode",
            choices=[m.value for m in CudagraphMode],
            default=CudagraphMode.FULL_AND_PIECEWISE.value,
            help="the serving deployment's CUDA graph mode (decides capture rules)",
        )
        sub.add_argument(
            "--cudagraph-capture-sizes",
            type=_int_list,
            default=None,
            help="the serving deployment's capture sizes (default: derived like vLLM)",
        )
        sub.add_argument(
            "--cache-bytes",
            type=_positive,
            default=None,
            help="declare the cache size the weight banks must overflow (default: read)",
        )
        sub.add_argument(
            "--warmup-cycles",
            type=int,
            default=1,
            help="complete 2B bank cycles of warmup per context (default 1)",
        )
        sub.add_argument(
            "--quality-tolerance",
            type=float,
            default=0.03,
            help="B/2B pooled-median tolerance (default 0.03)",
        )
        sub.add_argument(
            "--control-attempts",
            type=_positive,
            default=3,
            help="measurements of a point whose control fails, per run (default 3)",
        )
        sub.add_argument(
            "--engine-attention-backend",
            default=None,
            help="attention backend of a component engine (vllm-live; e.g. TRITON_ATTN)",
        )
        sub.add_argument(
            "--engine-kv-cache-bytes",
            type=_positive,
            default=None,
            help="KV cache bytes of a component engine (vllm-live; default 1 GiB, R31)",
        )
        sub.add_argument(
            "--profile-batch",
            type=_positive,
            default=8,
            help="points measured in one profiler session (default 8; 1: a session per point)",
        )
        sub.add_argument(
            "--progress-json",
            type=Path,
            default=None,
            help="append JSON progress events to this file",
        )
        sub.add_argument(
            "--phase-log",
            type=Path,
            default=None,
            help="append the run's wall seconds per phase as one JSON line (issue 19)",
        )
        sub.add_argument("--no-progress-bar", action="store_true")
        sub.add_argument("--dry-run", action="store_true", help="validate and plan, then stop")
        sub.add_argument("--force", action="store_true", help=argparse.SUPPRESS)
    return parser


def prepare(
    args: argparse.Namespace, argv: Sequence[str]
) -> tuple[AcquisitionRequest, list[PointPlan]]:
    """Resolve the command into a request and one plan per target; no torch involved."""
    if args.force:
        raise ValueError(
            "--force is rejected: resume the original acquisition, or choose another --out-root "
            "for a new measurement"
        )
    model = resolve_model(args.model)
    dtype = args.dtype if args.dtype != "auto" else model.dtype
    if dtype is None:
        raise CatalogError(f"{model.name}: config.json names no torch_dtype; pass --dtype")
    variant = variant_for_dtype(dtype)
    deployments = select_deployments(args.command, args.tp, args.tp_refresh, args.dp, args.ep)
    targets = targets_for(model, deployments)
    if args.max_num_seqs > args.max_num_batched_tokens:
        raise ValueError(
            f"--max-num-seqs {args.max_num_seqs} exceeds --max-num-batched-tokens "
            f"{args.max_num_batched_tokens}; vLLM refuses such limits"
        )
    settings = ProtocolSettings(
        rounds=args.moe_rounds,
        iterations=args.measurement_iterations,
        warmup_cycles=args.warmup_cycles,
        tolerance=args.quality_tolerance,
        attempts=args.control_attempts,
        batch_points=args.profile_batch,
    )
    mode = CudagraphMode(args.cudagraph_mode)
    if args.cudagraph_capture_sizes:
        bad = [s for s in args.cudagraph_capture_sizes if s < 1]
        if bad:
            raise ValueError(f"--cudagraph-capture-sizes must be positive, got {bad}")
        captures = CaptureSizes(tuple(sorted(set(args.cudagraph_capture_sizes))), "target_option")
    else:
        captures = derived_capture_sizes(args.max_num_seqs, args.max_num_batched_tokens)
    request = AcquisitionRequest(
        command=args.command,
        model=model,
        hardware=args.hardware,
        dtype=dtype,
        variant=variant,
        out_root=args.out_root,
        backend=args.backend,
        device=args.device,
        settings=settings,
        max_num_batched_tokens=args.max_num_batched_tokens,
        max_num_seqs=args.max_num_seqs,
        grid_factor=args.moe_grid_factor,
        cudagraph_mode=mode,
        captures=captures,
        cache_bytes=args.cache_bytes,
        command_line=shlex.join(["python", "-m", "acquisition", *argv]),
        engine_attention_backend=args.engine_attention_backend,
        engine_kv_cache_bytes=args.engine_kv_cache_bytes,
    )
    plans = [plan_target(request, target, default_components(target)) for target in targets]
    return request, plans


def default_components(target: MoeTarget) -> tuple[str, ...]:
    """The modular component set (R22, R23), until an admitted adapter names its own."""
    if target.dp > 1:
        return ("gate_routing", EXPERTS, "finalize_copy")
    return ("gate_routing", EXPERTS)


def plan_target(
    request: AcquisitionRequest, target: MoeTarget, components: Sequence[str]
) -> PointPlan:
    model = request.model
    geometry = ExpertGeometry.for_target(model.global_experts, model.top_k, target)
    return build_plan(
        target,
        geometry,
        components,
        max_num_batched_tokens=request.max_num_batched_tokens,
        max_num_seqs=request.max_num_seqs,
        factor=request.grid_factor,
        mode=request.cudagraph_mode,
        captures=request.captures,
    )


def _describe(plan: PointPlan) -> str:
    t = plan.target
    counts = ", ".join(f"{c} {plan.count(c)}" for c in plan.components)
    return (
        f"TP{t.tp} {t.deployment}: {len(plan.points)} points ({counts}); local rows <= "
        f"{plan.axes.local_budget}, expert rows <= {plan.axes.expert_maximum}, "
        f"L={plan.geometry.local_experts}; plan {plan.sha256[:12]}"
    )


def _terminate(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: Sequence[str] | None = None, *, whole_process: bool | None = None) -> int:
    """``whole_process`` (default: no ``argv`` given) books the interpreter's start in the
    phase log; a call inside a longer-lived process times only itself."""
    clock = PhaseClock(whole_process=argv is None if whole_process is None else whole_process)
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    clock.path = args.phase_log
    try:
        with clock.phase("plan"):
            request, plans = prepare(args, argv)
    except (CatalogError, DegreeError, ValueError) as exc:
        print(f"{parser.prog} {args.command}: error: {exc}", file=sys.stderr)
        return EXIT_INVALID
    total = sum(len(p.points) for p in plans)
    progress = ProgressReporter(
        args.progress_json, bar=not (args.no_progress_bar or args.dry_run), total=total
    )
    try:
        progress.event("plan", f"{len(plans)} targets, {total} points")
        for plan in plans:
            progress.write(_describe(plan))
        if args.dry_run:
            progress.event("done", "dry run: planned only")
            return 0
        status: int | None = None
        try:
            status = _acquire(request, plans, progress, clock)
        finally:
            # Written whatever happened (an unexpected error leaves exit_status null).
            clock.write(
                exit_status=status,
                backend=request.backend,
                command_line=request.command_line,
                points_total=progress.total,
                points_done=progress.done,
            )
        return status
    finally:
        progress.close()


def _acquire(
    request: AcquisitionRequest,
    plans: list[PointPlan],
    progress: ProgressReporter,
    clock: PhaseClock,
) -> int:
    # Imported here: validation and planning above never need torch.
    from acquisition.acquire import AcquisitionFailure, acquire_target
    from acquisition.adapters import AdmissionError, select_backend
    from acquisition.adapters.base import AdapterRefusal, EngineLimits
    from acquisition.protocol.samples import CheckpointError
    from acquisition.runtime import DeviceError, probe_runtime

    previous = signal.signal(signal.SIGTERM, _terminate)
    started = time.monotonic()
    try:
        # The serving limits and the engine options travel with the runtime (R31).
        limits = EngineLimits(
            request.max_num_batched_tokens,
            request.max_num_seqs,
            kv_cache_memory_bytes=request.engine_kv_cache_bytes,
            attention_backend=request.engine_attention_backend,
        )
        with clock.phase("runtime_probe"):
            runtime = replace(probe_runtime(request.device, request.cache_bytes), limits=limits)
        progress.event("admission", f"{runtime.device}: {runtime.device_name}")
        selections = []
        for plan in plans:
            with clock.phase("admission"):
                backend, report = select_backend(
                    request.backend, request.model, plan.target, runtime
                )
            for line in report.lines():
                progress.write(line)
            # The admitted path decides the components (the live path times a wrapper).
            declared = getattr(backend, "components", None)
            if declared is not None:
                components = tuple(declared(request.model, plan.target))
                if components != plan.components:
                    plan = plan_target(request, plan.target, components)
            selections.append((plan, backend, report))
        progress.total = sum(len(plan.points) for plan, _, _ in selections)
        published = []
        failed: list[str] = []
        for plan, backend, report in selections:
            outcome = acquire_target(request, plan, backend, runtime, report, progress, clock)
            if outcome.published:
                published.append(plan)
            else:
                failed.extend(f"{plan.target.deployment} {key}" for key in outcome.failed_points)
        if failed:
            message = (
                f"{len(failed)} expert points failed the stability control after "
                f"{request.settings.attempts} attempts (first: {failed[0]}); nothing was published "
                "for their targets; rerun the same command to measure them again"
            )
            progress.write(message)
            progress.event("failed", message, error=message)
            return EXIT_FAILED
        elapsed = time.monotonic() - started
        message = f"published {len(published)} targets into {request.bundle_dir} in {elapsed:.1f}s"
        progress.write(message)
        progress.event("done", message, bundle=str(request.bundle_dir))
        return 0
    except AdapterRefusal as exc:
        progress.write(f"{exc.backend} refused after building: " + "; ".join(exc.reasons))
        progress.event(
            "failed", "an adapter refused the target", error=str(exc), reasons=list(exc.reasons)
        )
        return EXIT_DECLINED
    except AdmissionError as exc:
        progress.write(str(exc))
        progress.event(
            "failed", "no adapter admitted a target", error=str(exc), admission=exc.report.as_dict()
        )
        return EXIT_DECLINED
    except AcquisitionFailure as exc:
        progress.write(f"error: {exc}")
        progress.event(
            "failed",
            str(exc),
            error=str(exc),
            failures=str(exc.failures) if exc.failures else None,
            trace=str(exc.trace) if exc.trace else None,
        )
        return EXIT_FAILED
    except (CheckpointError, DeviceError) as exc:
        progress.write(f"error: {exc}")
        progress.event("failed", str(exc), error=str(exc))
        return EXIT_FAILED
    except KeyboardInterrupt:
        progress.write("cancelled; samples are kept: rerun the same command to resume")
        progress.event("cancelled", "cancelled; samples kept for resume")
        return EXIT_CANCELLED
    finally:
        signal.signal(signal.SIGTERM, previous)
