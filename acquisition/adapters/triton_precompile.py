"""Triton's expert-kernel compilations moved out of the measuring loop (issue 19).

A lent machine starts with empty caches, so every configuration of vLLM's Triton expert
kernel (``fused_moe_kernel``) is compiled the first time a point's forward runs it: inside the
point's reference check, one compilation after another on the critical path. With the
kernel-step plan (``--moe-kernel-steps``) a target meets many more configurations.

Before a target's measuring loop, :func:`precompile` runs one *dry* forward per distinct
token-row count of the plan's expert points, through the session's own experts path (so the
kernel is called with exactly the arguments a measured forward passes: the configuration vLLM
picks for those rows, the integer and alignment specialisations Triton derives from them).
During these forwards the Triton kernels are switched to Triton's ``warmup`` mode: the launch
is compiled and cached, never run. Where Triton has ``AsyncCompileMode`` (3.4 and later) the
compilations are handed to a thread pool and run side by side (ptxas is a subprocess; Triton
releases the GIL in its own passes), and the mode's exit waits for all of them and puts each
compiled kernel into the kernel's in-process cache under the key the launch will look up.
Without it the same dry forwards compile one after another: still outside the points.

Nothing measured changes: the dry forwards run before the first point, on their own buffers,
outside any profiler session; every point still runs its reference check and the protocol's
warmup forwards (R17-R19) exactly as before; a point whose kernel was not precompiled (a
Triton that keys differently) simply compiles at first use, as before. The compiled binaries
also land in Triton's cache directory (``TRITON_CACHE_DIR``, default ``~/.triton/cache``),
which every target process of a run reads: a later target's precompilation of the same
configurations loads them instead of compiling them again.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from acquisition.protocol.stimulus import RoutingStimulus

__all__ = [
    "ASYNC_COMPILE_MODE",
    "TRITON_KERNELS",
    "PrecompileReport",
    "cached_kernels",
    "launches_compiled_only",
    "precompile",
    "precompile_stimuli",
]

# The Triton kernels of vLLM's expert path that a configuration change recompiles (dotted
# names for the adapters' resolvers). A missing one is skipped, never a refusal.
TRITON_KERNELS: dict[str, str] = {
    "fused_moe_kernel": "vllm.model_executor.layers.fused_moe.fused_moe:fused_moe_kernel",
}
# Triton's parallel compilation (Triton >= 3.4, triton-lang/triton#7306): its public name
# first, then where it is defined.
ASYNC_COMPILE_MODE = "triton:AsyncCompileMode"
_ASYNC_COMPILE_MODES = (ASYNC_COMPILE_MODE, "triton.runtime._async_compile:AsyncCompileMode")

AsyncMode = Callable[[ThreadPoolExecutor], contextlib.AbstractContextManager[Any]]


@dataclass(frozen=True, slots=True)
class PrecompileReport:
    """What one target's precompilation did (the phase log keeps it beside the seconds)."""

    # "parallel", "serial", "none" (nothing to compile with, reason says why) or "failed" (a
    # dry forward raised: what it did not compile compiles at first use, inside a point)
    mode: str
    workers: int
    rows: tuple[int, ...]
    kernels: tuple[str, ...]
    compiled: int | None  # new entries in the kernels' in-process caches (None: unreadable)
    seconds: float
    configs: int | None = None  # distinct Triton configurations the rows select, if modelled
    reason: str = ""
    fallback: tuple[str, ...] = field(default=())

    def as_dict(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "workers": self.workers,
            "rows": len(self.rows),
            "kernels": list(self.kernels),
            "compiled": self.compiled,
            "configs": self.configs,
            "seconds": round(self.seconds, 6),
            "reason": self.reason,
            "fallback": list(self.fallback),
        }


def cached_kernels(kernel: Any) -> int | None:
    """Entries of a Triton ``JITFunction``'s per-device kernel caches, or None if unreadable.

    (``device_caches`` maps a device to a tuple whose first item is the key -> kernel dict in
    Triton 3.x; an internal, so any other shape reads as unknown.)
    """
    caches = getattr(kernel, "device_caches", None)
    if not isinstance(caches, dict):
        return None
    total = 0
    for entry in list(caches.values()):
        table = entry[0] if isinstance(entry, tuple) and entry else None
        if not isinstance(table, dict):
            return None
        total += len(table)
    return total


@contextlib.contextmanager
def launches_compiled_only(kernels: Sequence[Any]) -> Iterator[None]:
    """Inside, each kernel's launches (``kernel[grid](...)`` calls ``kernel.run(...,
    warmup=False)``) become ``warmup=True``: compiled and cached, not run. Instance patches,
    removed on exit even after an error."""
    patched: list[Any] = []
    try:
        for kernel in kernels:
            if "run" in vars(kernel):
                raise RuntimeError(f"{kernel!r}.run is already patched")
            original = kernel.run

            def run(*args: Any, _run: Any = original, **kwargs: Any) -> Any:
                kwargs["warmup"] = True
                return _run(*args, **kwargs)

            kernel.run = run
            patched.append(kernel)
        yield
    finally:
        for kernel in patched:
            vars(kernel).pop("run", None)


def precompile(
    kernels: Sequence[tuple[str, Any]],
    forwards: Sequence[tuple[int, Callable[[], Any]]],
    *,
    workers: int,
    async_mode: AsyncMode | None,
    synchronize: Callable[[], None],
    configs: int | None = None,
) -> PrecompileReport:
    """Compile what ``forwards`` (``(rows, dry forward)``) launch of ``kernels`` (``(name,
    JITFunction)``), in parallel when ``async_mode`` (Triton's ``AsyncCompileMode``) is given.

    If the parallel mode fails to start or to finish, the remaining work falls back to
    serial compilation; what was compiled stays compiled. A dry forward that raises even then
    ends the precompilation (mode ``failed``, the error in ``fallback``) without failing the
    target: the points compile the rest at first use, as without precompilation. ``synchronize`` drains the device
    afterwards so that no dry forward's work is still queued when the first point starts.
    """
    started = time.perf_counter()
    rows = tuple(r for r, _ in forwards)
    names = tuple(name for name, _ in kernels)
    if not kernels or not forwards:
        reason = "no Triton expert kernel resolved" if not kernels else "no expert points"
        return PrecompileReport("none", 0, rows, names, 0, 0.0, configs, reason)
    objects = [kernel for _, kernel in kernels]
    before = [cached_kernels(k) for k in objects]
    fallback: list[str] = []
    mode = "serial"
    with launches_compiled_only(objects):
        done = 0
        if async_mode is not None and workers > 1:
            try:
                with ThreadPoolExecutor(max_workers=workers) as pool, async_mode(pool):
                    for _, forward in forwards:
                        forward()
                        done += 1
                mode = "parallel"
            except Exception as exc:  # a Triton whose async mode differs: compile serially
                fallback.append(f"{type(exc).__name__}: {exc}")
                done = 0
        if mode != "parallel":
            try:
                for _, forward in forwards[done:]:
                    forward()
            except Exception as exc:  # never fatal: what is left compiles at first use
                mode = "failed"
                fallback.append(f"{type(exc).__name__}: {exc}")
    synchronize()
    after = [cached_kernels(k) for k in objects]
    compiled: int | None = 0
    for a, b in zip(after, before, strict=True):
        compiled = None if a is None or b is None or compiled is None else compiled + a - b
    return PrecompileReport(
        mode,
        workers if mode == "parallel" else 1 if mode == "serial" else 0,
        rows,
        names,
        compiled,
        time.perf_counter() - started,
        configs,
        fallback=tuple(fallback),
    )


def precompile_stimuli(
    resolve: Callable[[str], Any] | None,
    stimuli: Sequence[RoutingStimulus],
    dry_forward: Callable[[RoutingStimulus], Any],
    *,
    workers: int,
    synchronize: Callable[[], None],
    configs: int | None = None,
) -> PrecompileReport:
    """A session's precompilation: the kernels and Triton's async mode found by ``resolve``
    (each optional: a missing one is skipped), one ``dry_forward(stimulus)`` per stimulus."""
    kernels: list[tuple[str, Any]] = []
    async_mode: Any = None
    if resolve is not None:
        for name, dotted in TRITON_KERNELS.items():
            with contextlib.suppress(Exception):
                kernels.append((name, resolve(dotted)))
        for dotted in _ASYNC_COMPILE_MODES:
            with contextlib.suppress(Exception):
                async_mode = resolve(dotted)
                break
    forwards = [(s.tokens, lambda s=s: dry_forward(s)) for s in stimuli]
    return precompile(
        kernels,
        forwards,
        workers=workers,
        async_mode=async_mode,
        synchronize=synchronize,
        configs=configs,
    )
