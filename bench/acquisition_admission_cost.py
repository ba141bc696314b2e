"""Where the start of an acquisition goes before its first point: runtime probe and admission.

    PYTHONPATH=. python3 bench/acquisition_admission_cost.py [--json FILE] -- SLICE ARGUMENTS

The session-8 H200 run of the default grid spent 41 s of its 286 s before any target began
(admission 15.5 s in the first process, 12.3 s in the rerun; the runtime probe 4.2 s and 2.8 s;
docs/benchmarks.md, issue 19). This runs exactly the CLI's two start phases for the slice the
arguments name (``python -m acquisition slice ...`` arguments after ``--``): ``prepare`` (the
plan), ``probe_runtime`` and ``select_backend`` for every planned target, each under cProfile,
and prints per phase its wall seconds and the functions with the most cumulative time, the
modules imported in each phase (how many, and the slowest top-level packages by the time
between the first import of a package and the next one), so that a change can aim at what is
really there. Nothing is measured or written besides ``--json``.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import sys
import time
from pathlib import Path
from typing import Any


def _profiled(label: str, call: Any) -> tuple[Any, dict[str, Any]]:
    before = set(sys.modules)
    profile = cProfile.Profile()
    started = time.perf_counter()
    profile.enable()
    try:
        value = call()
    finally:
        profile.disable()
    wall = time.perf_counter() - started
    stream = io.StringIO()
    stats = pstats.Stats(profile, stream=stream)
    stats.sort_stats("cumulative").print_stats(25)
    imported = sorted(set(sys.modules) - before)
    packages: dict[str, int] = {}
    for name in imported:
        top = name.split(".", 1)[0]
        packages[top] = packages.get(top, 0) + 1
    return value, {
        "phase": label,
        "wall_s": round(wall, 3),
        "modules_imported": len(imported),
        "packages": dict(sorted(packages.items(), key=lambda kv: -kv[1])[:15]),
        "cumulative": stream.getvalue().splitlines()[:60],
    }


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--" in argv:
        split = argv.index("--")
        own, slice_args = argv[:split], argv[split + 1 :]
    else:
        own, slice_args = argv, []
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(own)
    if not slice_args:
        parser.error("give the slice arguments after --")

    from acquisition import cli
    from acquisition.adapters import select_backend
    from acquisition.adapters.base import EngineLimits
    from acquisition.runtime import probe_runtime

    records: list[dict[str, Any]] = []
    namespace = cli.build_parser().parse_args(slice_args)
    (request, plans), record = _profiled("plan", lambda: cli.prepare(namespace, slice_args))
    records.append(record)
    limits = EngineLimits(
        request.max_num_batched_tokens,
        request.max_num_seqs,
        kv_cache_memory_bytes=request.engine_kv_cache_bytes,
        attention_backend=request.engine_attention_backend,
    )
    from dataclasses import replace

    runtime, record = _profiled(
        "runtime_probe",
        lambda: replace(probe_runtime(request.device, request.cache_bytes), limits=limits),
    )
    records.append(record)
    for plan in plans:
        (backend, _report), record = _profiled(
            f"admission {plan.target.deployment}",
            lambda plan=plan: select_backend(request.backend, request.model, plan.target, runtime),
        )
        record["backend"] = backend.name
        records.append(record)

    for record in records:
        print(
            f"## {record['phase']}: {record['wall_s']:.3f} s, "
            f"{record['modules_imported']} modules imported {record['packages']}"
        )
        print("\n".join(record["cumulative"]))
        print()
    if args.json is not None:
        args.json.write_text(json.dumps(records, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
