"""``python -m acquisition profile|slice MODEL ...``: the seed's interface (R6-R9); and
``python -m acquisition conserve BUNDLE...`` (acquisition/conserve.py), which adds conservation
traces to published tables that lack them.

Everything that can be wrong with a command (unknown model, unmatched TP/DP/EP degrees, bad
limits, an undeclared sequence-parallel wrapper) is reported before torch is imported or any
device is touched. ``--dry-run`` stops after planning and prints the point counts, so a
registry can validate a job without a GPU.

Exit status: 0 published, 1 acquisition failed (evidence kept), 2 invalid command,
3 no adapter admitted a target, 130 cancelled (SIGINT or SIGTERM; samples kept for resume).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import replace
from typing import TYPE_CHECKING

from acquisition.bytecode import bytecode_note, uncached_packages
from acquisition.conserve import ConserveError, out_path, plan_targets
from acquisition.conserve import add_arguments as conserve_arguments
from acquisition.finished import split_finished, write_marker
from acquisition.options import (
    OptionError,
    add_arguments,
    command_line,
    from_namespace,
    plan_target,
    target_key,
)
from acquisition.options import prepare as prepare_options
from acquisition.phases import PhaseClock
from acquisition.progress import ProgressReporter

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence
    from types import FrameType

    from acquisition.plan import PointPlan
    from acquisition.request import AcquisitionRequest

__all__ = ["build_parser", "main", "prepare"]

EXIT_FAILED = 1
EXIT_INVALID = 2
EXIT_DECLINED = 3
EXIT_CANCELLED = 130


def build_parser() -> argparse.ArgumentParser:
    """The CLI's parser; every option comes from `acquisition.options.OPTIONS`."""
    parser = argparse.ArgumentParser(
        prog="python -m acquisition",
        description="Measure native MoE components into a moetables bundle.",
    )
    commands = parser.add_subparsers(
        dest="command", required=True, metavar="profile|slice|conserve"
    )
    for name, help_text in (
        ("profile", "acquire the MoE components of every --tp degree"),
        ("slice", "refresh only the MoE category of the --tp-refresh degree"),
    ):
        add_arguments(commands.add_parser(name, help=help_text))
    conserve_arguments(
        commands.add_parser(
            "conserve",
            help="add conservation traces to published tables that lack them, measured now "
            "on the table's backend and hardware (marked supplementary)",
        )
    )
    return parser


def prepare(
    args: argparse.Namespace, argv: Sequence[str]
) -> tuple[AcquisitionRequest, list[PointPlan]]:
    """Resolve the command into a request and one plan per target; no torch involved.

    Raises `OptionError` naming the option at fault.
    """
    return prepare_options(from_namespace(args), command_line(argv))


def _describe(plan: PointPlan) -> str:
    t = plan.target
    counts = ", ".join(f"{c} {plan.count(c)}" for c in plan.components)
    # The rule is named (v2, v3, v4): `auto` and `on` follow the default, which has changed.
    kernel = (
        f"; kernel steps {plan.kernel.rule.rsplit('-', 1)[-1]}: +{plan.kernel_points} expert "
        f"points ({plan.kernel.source})"
        if plan.kernel is not None
        else "; kernel steps off"
    )
    return (
        f"TP{t.tp} {t.deployment}: {len(plan.points)} points ({counts}); local rows <= "
        f"{plan.axes.local_budget}, expert rows <= {plan.axes.expert_maximum}, "
        f"L={plan.geometry.local_experts}{kernel}; plan {plan.sha256[:12]}"
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
    if args.command == "conserve":
        return _conserve(args, argv)
    clock.path = args.phase_log
    try:
        with clock.phase("plan"):
            request, plans = prepare(args, argv)
    except OptionError as exc:
        print(f"{parser.prog} {args.command}: error: {exc.message}", file=sys.stderr)
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
            with clock.phase("plan"):
                plans = _skip_finished(request, plans, progress)
            if plans and args.only_target is None:
                _note_bytecode(progress, clock)
            if not plans:
                status = 0
                message = f"every target is published in {request.bundle_dir} already"
                progress.write(message)
                progress.event("done", message, bundle=str(request.bundle_dir))
            elif _isolated(args, plans):
                status = _acquire_isolated(request, argv, plans, progress, clock)
            else:
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


def _note_bytecode(progress: ProgressReporter, clock: PhaseClock) -> None:
    """Say once, in the parent, when every process will compile torch and vLLM anew (an
    isolated target's child is started with ``--only-target`` and stays quiet)."""
    missing = uncached_packages()
    clock.note("bytecode", {"uncached": missing, "dont_write": sys.dont_write_bytecode})
    note = bytecode_note(missing)
    if note is not None:
        progress.write(note)


def _skip_finished(
    request: AcquisitionRequest, plans: list[PointPlan], progress: ProgressReporter
) -> list[PointPlan]:
    """The plans a run still has to start: a resume admits, builds and starts no process for
    a target already published from an unchanged checkpoint (`acquisition.finished`). Its
    points count as resumed, with the published count (the admitted plan's), so the total
    and the ETA stay exact."""
    pending, finished = split_finished(request, plans)
    for plan, done in finished:
        key = target_key(plan.target)
        progress.set_target(key)
        progress.total += done.points - len(plan.points)
        progress.write(
            f"{key}: published already ({done.points} points, {done.backend}, plan "
            f"{done.plan_sha256[:12]}); skipped"
        )
        progress.skipped(done.points)
    return pending


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
        for requested in plans:
            plan = requested
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
            selections.append((requested, plan, backend, report))
        # Points resumed from published targets are counted already; the admitted plans may
        # differ in size from the requested ones.
        progress.total = progress.done + sum(len(plan.points) for _, plan, _, _ in selections)
        published = []
        failed: list[str] = []
        for requested, plan, backend, report in selections:
            outcome = acquire_target(request, plan, backend, runtime, report, progress, clock)
            if outcome.published:
                published.append(plan)
                with clock.phase("publish"):
                    write_marker(request, requested, plan)
            else:
                failed.extend(f"{plan.target.deployment} {key}" for key in outcome.failed_points)
        if failed:
            message = (
                f"{len(failed)} expert points failed the stability control after "
                f"{request.settings.attempts} attempts (first: {failed[0]}); nothing was published "
                "for their targets; rerun the same command to measure them again"
            )
            progress.write(message)
            # failed_points: an isolating parent continues with its other targets (as here).
            progress.event("failed", message, error=message, failed_points=failed)
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


def _conserve(args: argparse.Namespace, argv: Sequence[str]) -> int:
    """``conserve``: refusals that need no device first (exit 2), then one process traces
    every target (exit 1 if any bundle could not be written; the others are written)."""
    from acquisition.conserve import run

    try:
        targets = plan_targets(args.bundles, only=args.target, replace=args.replace)
        if args.out is not None:
            for bundle in args.bundles:
                dest = out_path(args.out, bundle)
                if dest.exists():
                    raise ConserveError(f"{dest} exists already; choose another --out")
    except ConserveError as exc:
        print(f"python -m acquisition conserve: {exc}", file=sys.stderr)
        return EXIT_INVALID
    progress = ProgressReporter(
        args.progress_json, bar=not (args.no_progress_bar or args.dry_run), total=len(targets)
    )
    try:
        progress.event("plan", f"{len(targets)} targets in {len(args.bundles)} bundles")
        for target in targets:
            progress.write(
                f"{target.label}: {target.backend}, {target.model.name}, "
                f"measured {target.provenance.get('started_at')} on "
                f"{target.provenance.get('device_name')}"
            )
        if args.dry_run:
            progress.event("done", "dry run: checked only")
            return 0
        previous = signal.signal(signal.SIGTERM, _terminate)
        command = " ".join(["python -m acquisition", *argv])
        started = time.monotonic()
        try:
            written, failures = run(
                targets,
                out=args.out,
                replace_rows=args.replace,
                command_line=command,
                progress=progress,
            )
        except KeyboardInterrupt:
            progress.write("cancelled; bundles not yet written are left as they were")
            progress.event("cancelled", "cancelled")
            return EXIT_CANCELLED
        finally:
            signal.signal(signal.SIGTERM, previous)
        elapsed = time.monotonic() - started
        if failures:
            message = f"{len(failures)} bundles not written (first: {failures[0]})"
            progress.write(message)
            progress.event("failed", message, error=message, failures=failures)
            return EXIT_FAILED
        message = f"wrote conservation into {len(written)} bundles in {elapsed:.1f}s"
        progress.write(message)
        progress.event("done", message, bundles=[str(p) for p in written])
        return 0
    finally:
        progress.close()


def _isolated(args: argparse.Namespace, plans: Sequence[PointPlan]) -> bool:
    """Whether each target runs in its own child process (``--isolate-targets``).

    ``auto`` isolates only where one process could carry state from one target into the next
    that no adapter owns: ``vllm-live`` (and ``auto``, which may admit it) on CUDA, whose
    every target starts a whole ``vllm.LLM`` engine with vLLM's process-wide engine, compile
    and distributed state. ``vllm-modular`` and ``torch-reference`` share one process: each
    modular session makes its own default VllmConfig current for its life and emulates EP
    through its expert map (no process group, no global EP setting), the finished target's
    memory is released before the next builds (`release_target_memory`), and the H200 check
    that isolation was introduced for found no process drift (docs/h200-runs.md, "Rank drift:
    one process vs isolated targets": each rank agrees with itself across one process and
    fresh children within 0.25-0.43 % median). One process saves a vLLM import (11-17 s)
    and a torch start per target after the first.
    """
    if args.only_target is not None or len(plans) < 2:
        return False
    if args.isolate_targets == "auto":
        return bool(args.device == "cuda" and args.backend in _ISOLATED_BACKENDS)
    return bool(args.isolate_targets == "on")


# Backends whose targets ``--isolate-targets auto`` runs in child processes on CUDA.
_ISOLATED_BACKENDS = ("vllm-live", "auto")


class _ChildFeed:
    """Turns a child's progress events into the parent's, so that one reporter counts the
    whole command: points resumed and measured, totals changed by admission, ETA."""

    def __init__(self, progress: ProgressReporter, planned: int) -> None:
        self.progress = progress
        self.planned = planned
        self.done = 0
        self.last = time.monotonic()
        self.failed: dict[str, object] | None = None
        # The first points a child reports carry its process start and build in their share.
        self.warm = True

    def feed(self, event: dict[str, object]) -> None:
        phase = str(event.get("phase"))
        target = event.get("target")
        if isinstance(target, str):
            self.progress.set_target(target)
        total = event.get("points_total")
        # The child's first event counts its plan before admission; admission may change it.
        if isinstance(total, int) and phase != "plan" and total != self.planned:
            self.progress.total += total - self.planned
            self.planned = total
        done = event.get("points_done")
        message = str(event.get("message", ""))
        if phase == "measure" and isinstance(done, int) and done > self.done:
            count, self.done = done - self.done, done
            if message.startswith("resumed:"):
                self.progress.skipped(count)
            else:
                now = time.monotonic()
                share, self.last = (now - self.last) / count, now
                for _ in range(count):
                    self.progress.measured(share, message, warm_up=self.warm)
                self.warm = False
            return
        if phase in ("failed", "cancelled") and isinstance(done, int) and done > self.done:
            # The child's last count, where its last points' own events did not come first.
            count, self.done = done - self.done, done
            for _ in range(count):
                self.progress.measured(0.0, message)
        if phase == "failed":
            self.failed = event
            return
        if phase in ("admission", "build", "measure", "publish"):
            self.last = time.monotonic()
            self.progress.event(phase, message)


def _run_child(child_argv: list[str], write_fd: int, read_fd: int, feed: _ChildFeed) -> int:
    """Run one child to its end, relaying its progress events; its exit status."""
    child = subprocess.Popen(
        [sys.executable, "-m", "acquisition", *child_argv], pass_fds=(write_fd,)
    )
    os.close(write_fd)

    def relay(lines: Iterable[str]) -> None:
        for line in lines:
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(record, dict):
                feed.feed(record)

    with os.fdopen(read_fd, encoding="utf-8") as events:
        try:
            relay(events)
            return child.wait()
        except BaseException:
            # Cancelled (SIGINT, SIGTERM) or broken: the child stops and keeps its samples.
            # The pipe stays open until the child has said its last (the points it finished
            # meanwhile, its cancelled event): the parent's count stays the checkpoint's, and
            # the child never writes into a closed pipe (a traceback and exit 1, not 130).
            child.send_signal(signal.SIGTERM)
            with contextlib.suppress(KeyboardInterrupt, OSError, ValueError):
                relay(events)
            child.wait()
            raise


def _acquire_isolated(
    request: AcquisitionRequest,
    argv: Sequence[str],
    plans: list[PointPlan],
    progress: ProgressReporter,
    clock: PhaseClock,
) -> int:
    """Each target by ``python -m acquisition ARGV --only-target KEY``, one after another.

    A child is the same command restricted to one target: it resumes from the same
    checkpoint, publishes under the same ``.meta.lock``, appends its own record to
    ``--phase-log`` and reports its progress through a pipe that the parent relays. The
    parent imports no torch and never touches the device.
    """
    previous = signal.signal(signal.SIGTERM, _terminate)
    started = time.monotonic()
    failed: list[str] = []
    published = 0
    try:
        for plan in plans:
            key = target_key(plan.target)
            read_fd, write_fd = os.pipe()
            child_argv = [
                *argv,
                "--only-target",
                key,
                "--isolate-targets",
                "off",
                "--no-progress-bar",
                "--progress-json",
                f"/dev/fd/{write_fd}",
            ]
            feed = _ChildFeed(progress, len(plan.points))
            progress.set_target(key)
            clock.set_target(key)
            progress.event("build", f"starting a child process for {key}")
            try:
                with clock.phase("isolated_target"):
                    status = _run_child(child_argv, write_fd, read_fd, feed)
            finally:
                clock.set_target("run")
            if status == 0:
                published += 1
                continue
            error = feed.failed or {}
            points = error.get("failed_points")
            if status == EXIT_FAILED and isinstance(points, list):
                failed.extend(str(p) for p in points)
                continue
            if status in (EXIT_CANCELLED, -signal.SIGINT, -signal.SIGTERM):
                raise KeyboardInterrupt(f"child for {key} cancelled")
            message = str(error.get("error") or f"the child process for {key} exited {status}")
            progress.event(
                "failed",
                message,
                **{
                    k: v for k, v in error.items() if k in ("error", "failures", "trace", "reasons")
                },
            )
            return status if status in (EXIT_FAILED, EXIT_DECLINED) else EXIT_FAILED
        if failed:
            message = (
                f"{len(failed)} expert points failed the stability control (first: {failed[0]}); "
                "nothing was published for their targets; rerun the same command to measure "
                "them again"
            )
            progress.write(message)
            progress.event("failed", message, error=message, failed_points=failed)
            return EXIT_FAILED
        elapsed = time.monotonic() - started
        message = (
            f"published {published} targets into {request.bundle_dir} in isolated processes "
            f"in {elapsed:.1f}s"
        )
        progress.write(message)
        progress.event("done", message, bundle=str(request.bundle_dir))
        return 0
    except KeyboardInterrupt:
        progress.write("cancelled; samples are kept: rerun the same command to resume")
        progress.event("cancelled", "cancelled; samples kept for resume")
        return EXIT_CANCELLED
    finally:
        signal.signal(signal.SIGTERM, previous)
