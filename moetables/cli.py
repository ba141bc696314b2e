"""Command line: validate a bundle, describe it, answer lookups from a JSON-lines file, or
estimate a MoE layer for a step's per-DP-rank token counts."""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

from moetables.bundle import EXPERTS, validate_bundle
from moetables.bundle.model import WaveModel
from moetables.comm import ClusterError, load_cluster
from moetables.describe import contracts_vllm_version, kernel_segments, tile_costs
from moetables.errors import BundleError, CoverageError, QueryError
from moetables.estimate import TILE_COST_WORDS
from moetables.estimate_query import answer_estimate, parse_estimate_request
from moetables.lookup import ComponentTables
from moetables.profiles import read_profile
from moetables.routing import POLICIES, is_count

__all__ = ["main"]


def _validate_profile(path: Path, out: TextIO) -> int:
    try:
        profile = read_profile(path)
    except BundleError as exc:
        print(f"invalid: {path}", file=out)
        print(f"  - {exc}", file=out)
        return 1
    imbalance = profile.imbalance()
    print(
        f"ok: {path}: routing profile of {profile.meta['model']['name']} "
        f"(E={profile.global_experts}, top-{profile.top_k}), {len(profile.layers)} layers, "
        f"{profile.steps} steps, {int(profile.step_tokens.sum())} tokens, router "
        f"{profile.meta['router']}; imbalance max/mean {imbalance.min():.2f}-"
        f"{imbalance.max():.2f} over layers",
        file=out,
    )
    return 0


def _validate(args: argparse.Namespace, out: TextIO) -> int:
    # A routing profile is one file; a bundle is a folder (or its meta.yaml).
    if str(args.bundle).endswith(".routing.npz") or (
        Path(args.bundle).is_file() and Path(args.bundle).name != "meta.yaml"
    ):
        return _validate_profile(Path(args.bundle), out)
    report = validate_bundle(args.bundle)
    if report.ok and report.bundle is not None:
        rows = sum(len(t) for t in report.tables.values())
        print(
            f"ok: {args.bundle}: {len(report.bundle.entries)} deployment tables, {rows} rows, "
            f"{report.bundle.layout} layout",
            file=out,
        )
        for path, evidence in report.quality.items():
            if evidence.stability is None:
                print(f"evidence: {path}: none ({evidence.stability_absent})", file=out)
                continue
            forwards = (
                f"{len(evidence.conservation)} traced forwards conserved"
                if evidence.conservation is not None
                else f"no traced forward ({evidence.conservation_absent})"
            )
            if evidence.conservation_supplement is not None:
                forwards += (
                    " (measured separately from the table, "
                    f"{evidence.conservation_supplement.get('measured_at')})"
                )
            print(
                f"evidence: {path}: {len(evidence.stability)} B/2B controls "
                f"(from {evidence.source}), {forwards}",
                file=out,
            )
        for entry in report.bundle.entries:
            loads = entry.expert_loads
            spread = report.loads.get(entry.table_path, ())
            for model in loads.models:
                # format 3: one cost for blocks of at least block_m rows; 4: one per block size
                at = ">= " if loads.tile_model is not None else ""
                what = (
                    f"weighted waves of the kernel's grid ({model.programs_per_sm} programs per "
                    f"SM, {model.sms} SMs) at {model.block_m}-row blocks cost "
                    f"{model.wave_cost_us} us each"
                    if isinstance(model, WaveModel)
                    else f"row tiles of {at}{model.block_m} rows cost {model.tile_cost_us} us each"
                )
                print(
                    f"loads: {entry.table_path}: rows {loads.rows}; {what} (vLLM "
                    f"{model.vllm_version}), refitted from {len(spread)} timed loads",
                    file=out,
                )
        for name in report.bundle.missing_files:
            print(f"note: meta.yaml names {name}, which is not in this bundle", file=out)
        return 0
    print(f"invalid: {args.bundle}", file=out)
    for problem in report.problems:
        print(f"  - {problem}", file=out)
    return 1


def describe(path: str | Path) -> dict[str, Any]:
    """What ``info`` prints: identity, and per deployment its components and support."""
    report = validate_bundle(path)
    if report.bundle is None:
        raise BundleError(str(path), "; ".join(report.problems))
    bundle = report.bundle
    deployments = []
    for entry in bundle.entries:
        table = report.tables.get(entry.table_path)
        item: dict[str, Any] = {
            "target": entry.target.as_dict(),
            "table": entry.table_path,
            "layout": entry.layout,
            "components": list(entry.components),
            "modes": list(entry.modes),
            "global_experts": entry.geometry.global_experts,
            "top_k": entry.geometry.top_k,
            "local_experts": entry.geometry.local_experts,
            "table_sha256": entry.table_sha256,
        }
        costs = tile_costs(entry.expert_loads)
        if costs:
            item["tile_costs"] = costs
        if table is not None:
            experts = table.component == EXPERTS
            item["rows"] = len(table)
            if experts.any():
                item["support"] = {
                    axis: [int(col[experts].min()), int(col[experts].max())]
                    for axis, col in (
                        ("tokens", table.tokens),
                        ("activated_experts", table.activated_experts),
                        ("local_assignments", table.local_assignments),
                    )
                }
                segments = kernel_segments(
                    entry, table.tokens[experts & (table.activated_experts > 0)]
                )
                if segments is not None:
                    item["kernel_segments"] = segments
        else:
            item["problem"] = next((p for p in report.problems if entry.table_path in p), None)
        deployments.append(item)
    return {
        "bundle": str(path),
        "valid": report.ok,
        "layout": bundle.layout,
        "hardware": bundle.hardware,
        "model": bundle.model,
        "variant": bundle.variant,
        # meta.yaml names it for the historical layout; current bundles name it per contract
        "vllm_version": bundle.meta.get("vllm_version")
        or contracts_vllm_version(e.contract for e in bundle.entries),
        "missing_files": list(bundle.missing_files),
        "deployments": deployments,
    }


def _info(args: argparse.Namespace, out: TextIO) -> int:
    try:
        info = describe(args.bundle)
    except BundleError as exc:
        print(f"invalid: {exc}", file=out)
        return 1
    json.dump(info, out, indent=2)
    out.write("\n")
    return 0 if info["valid"] else 1


def _lookup(args: argparse.Namespace, out: TextIO) -> int:
    try:
        tables = ComponentTables(args.bundle)
        deployment = tables.deployment(args.tp, args.dp, args.rank, args.sequence_parallel)
    except (BundleError, CoverageError, QueryError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    text = sys.stdin.read() if args.queries == "-" else Path(args.queries).read_text("utf-8")
    parsed: list[Any] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            parsed.append(json.loads(line))
        except json.JSONDecodeError as exc:
            parsed.append(QueryError(f"line {number} is not JSON: {exc.msg}"))
    valid = [q for q in parsed if not isinstance(q, QueryError)]
    answers = iter(deployment.answer(valid))
    for item in parsed:
        if isinstance(item, QueryError):
            answer: dict[str, Any] = {"error": "invalid", "message": str(item)}
        else:
            answer = next(answers)
        out.write(json.dumps(answer) + "\n")
    return 0


_STEP_KEYS = frozenset({"tokens", "expert_counts"})


def _read_steps(text: str) -> tuple[list[Any], list[int]]:
    """``--tokens``: ``n0,n1,...`` for one step, else a JSONL file of steps (each line a list
    of counts, or an object with ``tokens`` and, for the histogram policy, ``expert_counts``).

    Also each step's line number in the file (blank lines are skipped, not counted as steps,
    but an answer names the line a person finds in an editor). A line that is not JSON, or
    an object with keys a step does not have, becomes that line's QueryError."""
    if re.fullmatch(r"\s*\d+(\s*,\s*\d+)*\s*", text):
        return [int(n) for n in text.split(",")], [0]
    path = Path(text)
    if not path.is_file():
        raise QueryError(f"--tokens {text!r} is neither n0,n1,... nor a JSONL file of steps")
    steps: list[Any] = []
    lines: list[int] = []
    for number, line in enumerate(path.read_text("utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        lines.append(number)
        try:
            step = json.loads(line)
        except json.JSONDecodeError as exc:
            steps.append(QueryError(f"not JSON: {exc.msg}"))
            continue
        unknown = sorted(set(step) - _STEP_KEYS) if isinstance(step, dict) else []
        if unknown:
            step = QueryError(
                f"unknown key {unknown[0]!r}: a step is a list of token counts per DP rank, or "
                f"an object with {sorted(_STEP_KEYS)}"
            )
        elif isinstance(step, dict) and "tokens" not in step:
            step = QueryError("an object step needs 'tokens' (its token counts per DP rank)")
        steps.append(step)
    return steps, lines


def _estimate_request(args: argparse.Namespace, tokens: Any, counts: Any) -> dict[str, Any]:
    raw: dict[str, Any] = {
        "tp": args.tp,
        "dp": args.dp,
        "sequence_parallel": args.sequence_parallel,
        "tokens": tokens,
        "policy": args.policy,
        "seed": args.seed,
        "first_step": args.first_step,
        "mode": args.mode,
        "events": not args.no_events,
        "rank_expert_counts": args.rank_expert_counts,
    }
    for key, value in (
        ("expert_counts", counts),
        ("active_curve", args.active_curve),
        ("load_shares", args.load_shares),
        ("capture_sizes", args.capture_sizes),
        ("profile", args.profile),
        ("layer", args.layer),
        ("profile_draw", "expectation" if args.profile_expectation else None),
        ("tile_cost_us", args.tile_cost_us),
    ):
        if value is not None:
            raw[key] = value
    return raw


def _tile_cost(text: str) -> float | str:
    """``--tile-cost-us``: a number, or ``auto``, ``table`` or ``none``."""
    return text if text in TILE_COST_WORDS else float(text)


def _json_arg(text: str | None, what: str) -> Any:
    if text is None:
        return None
    source = Path(text).read_text("utf-8") if Path(text).is_file() else text
    try:
        return json.loads(source)
    except json.JSONDecodeError as exc:
        raise QueryError(f"{what} is not JSON (a file or inline): {exc.msg}") from None


def _estimate(args: argparse.Namespace, out: TextIO) -> int:
    """One JSON answer for ``n0,n1,...``; one answer line per step for a JSONL file."""
    try:
        tables = ComponentTables(args.bundle)
        cluster = load_cluster(args.cluster) if args.cluster else None
        steps, lines = _read_steps(args.tokens)
        args.active_curve = _json_arg(args.active_curve, "--active-curve")
        args.load_shares = _json_arg(args.load_shares, "--load-shares")
        counts = _json_arg(args.expert_counts, "--expert-counts")
        if args.profile is not None:
            args.profile = read_profile(args.profile)
        if args.capture_sizes is not None:
            args.capture_sizes = [int(s) for s in args.capture_sizes.split(",")]
    except (BundleError, ClusterError, QueryError, OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if steps and isinstance(steps[0], int):  # one step on the command line
        try:
            request = parse_estimate_request(_estimate_request(args, steps, counts))
            answer = answer_estimate(tables, request, cluster)
        except (QueryError, CoverageError, BundleError) as exc:
            json.dump({"error": _error_name(exc), "message": str(exc)}, out)
            out.write("\n")
            return 1
        json.dump(answer, out, indent=2)
        out.write("\n")
        return 0
    # A file of steps: each line answered on its own line, refusals included.
    if counts is not None and not (isinstance(counts, list) and len(counts) == len(steps)):
        print(
            "error: with a file of steps, --expert-counts must hold one list per step",
            file=sys.stderr,
        )
        return 1
    batched = _estimate_together(args, tables, cluster, steps, counts, lines)
    if batched is not None:
        for answer in batched:
            out.write(json.dumps(answer) + "\n")
        return 1 if steps and all("error" in a for a in batched) else 0
    # Some line needs its own error: every line is answered on its own, step i as the i-th
    # step of the file (the seeded stream's index first_step + i), so that the good lines get
    # the answers one batch would have given them.
    failed = 0
    first = args.first_step
    for i, step in enumerate(steps):
        try:
            if isinstance(step, QueryError):
                raise step
            tokens, own = (
                (step.get("tokens"), step.get("expert_counts"))
                if isinstance(step, dict)
                else (step, None)
            )
            step_counts = own if own is not None else (counts[i] if counts is not None else None)
            raw = _estimate_request(args, tokens, step_counts)
            if is_count(first):  # else the request refuses --first-step, naming it
                raw["first_step"] = first + i
            request = parse_estimate_request(raw)
            answer = answer_estimate(tables, request, cluster)
        except (QueryError, CoverageError, BundleError) as exc:
            answer = {"error": _error_name(exc), "message": f"line {lines[i]}: {exc}"}
            failed += 1
        out.write(json.dumps(answer) + "\n")
    return 1 if failed == len(steps) and steps else 0


def _estimate_together(
    args: argparse.Namespace,
    tables: Any,
    cluster: Any,
    steps: list[Any],
    counts: Any,
    lines: list[int],
) -> list[dict[str, Any]] | None:
    """A file of well-formed steps answered as one batch (the same answers, far faster);
    None when some line needs its own error, so that each line is answered on its own."""
    rows: list[Any] = []
    own: list[Any] = []
    for step in steps:
        if isinstance(step, dict):
            rows.append(step.get("tokens"))
            own.append(step.get("expert_counts"))
        elif isinstance(step, list):
            rows.append(step)
            own.append(None)
        else:
            return None
    if any(c is not None for c in own):
        if counts is not None or not all(c is not None for c in own):
            return None
        counts = own
    raw = _estimate_request(args, None, counts)
    del raw["tokens"]
    raw["steps"] = rows
    try:
        request = parse_estimate_request(raw, max_steps=max(1, len(rows)))
        answers = answer_estimate(tables, request, cluster)
    except (QueryError, CoverageError, BundleError):
        return None
    assert isinstance(answers, list)
    for i, answer in enumerate(answers):
        if "error" in answer:
            message = str(answer["message"])
            # The batch names a refusal by its step; the file's reader needs its line.
            if message.startswith(f"step {i}: "):
                message = message[len(f"step {i}: ") :]
            answer["message"] = f"line {lines[i]}: {message}"
    return answers


def _error_name(exc: Exception) -> str:
    if isinstance(exc, CoverageError):
        return "out_of_support"
    if isinstance(exc, BundleError):
        return "corrupt_bundle"
    return "invalid"


def _export(args: argparse.Namespace, out: TextIO) -> int:
    from moetables.export import ExportError, export_bundle

    try:
        report = export_bundle(args.bundle, args.format, args.out)
    except (ExportError, BundleError) as exc:
        problems = exc.problems if isinstance(exc, ExportError) else [str(exc)]
        print(f"refused: {args.bundle} as {args.format}", file=out)
        for problem in problems:
            print(f"  - {problem}", file=out)
        return 1
    print(f"ok: {report.rows} rows in {len(report.files)} files under {report.out}", file=out)
    for name in report.left_out:
        print(f"left out: {name}", file=out)
    return 0


def main(argv: Sequence[str] | None = None, out: TextIO | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m moetables", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser(
        "validate",
        help="check every file, checksum, contract and row of a bundle, or every member of a "
        "routing profile (.routing.npz)",
    )
    p.add_argument("bundle", help="a bundle folder, or a routing profile file")
    p = sub.add_parser("info", help="describe a bundle's deployments and support as JSON")
    p.add_argument("bundle")
    p = sub.add_parser("lookup", help="answer JSON-lines queries for one deployment rank")
    p.add_argument("bundle")
    p.add_argument("--tp", type=int, required=True)
    p.add_argument("--dp", type=int, required=True)
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--sequence-parallel", action="store_true")
    p.add_argument(
        "--queries",
        required=True,
        help="file of JSON objects, one per line; - for stdin. Keys: component, mode (eager), "
        "tokens, and for experts activated_experts and local_assignments; optionally loads "
        "('balanced', 'uniform', 'power_law(alpha)' or per-expert counts) and tile_cost_us "
        '(us per extra row tile). Example: {"component": "experts", "tokens": 2048, '
        '"activated_experts": 128, "local_assignments": 16384, "loads": "uniform"}',
    )
    p = sub.add_parser(
        "estimate",
        help="the MoE layer of one step (or a JSONL file of steps): ranks, collectives, time",
    )
    p.add_argument("bundle")
    p.add_argument("--tp", type=int, required=True)
    p.add_argument("--dp", type=int, required=True)
    p.add_argument("--sequence-parallel", action="store_true")
    p.add_argument(
        "--tokens",
        required=True,
        help="padded tokens per DP rank, n0,n1,...; or a JSONL file of steps (one answer each)",
    )
    p.add_argument("--policy", default="balanced", choices=list(POLICIES))
    p.add_argument(
        "--expert-counts",
        help="histogram policy: JSON list of the step's global per-expert pair counts (file "
        "or inline); for a file of steps, one list per step",
    )
    p.add_argument("--active-curve", help="custom policy: JSON [[N, A], ...] (file or inline)")
    p.add_argument("--load-shares", help="custom policy: JSON list, one share per EP rank")
    p.add_argument("--seed", type=int, default=0, help="random and captured policies' seed")
    p.add_argument(
        "--first-step",
        type=int,
        default=0,
        help="random and captured: the first step's index in the seeded stream (step i of "
        "the file draws from (seed, first_step + i)); for a run estimated in parts",
    )
    p.add_argument("--profile", help="captured policy: a routing profile file (.routing.npz)")
    p.add_argument("--layer", type=int, help="captured policy: the profile's layer (default all)")
    p.add_argument(
        "--profile-expectation",
        action="store_true",
        help="captured policy: the mean per-rank (A, M) at N instead of a seeded draw",
    )
    p.add_argument("--cluster", help="cluster description YAML (schema moe-cluster)")
    p.add_argument("--mode", default="eager", choices=["eager", "graph"])
    p.add_argument(
        "--no-events",
        action="store_true",
        help="leave out the per-rank trace events (smaller, faster answers)",
    )
    p.add_argument(
        "--rank-expert-counts",
        action="store_true",
        help="add each rank's pairs per local expert (expert_range, expert_counts); "
        "histogram, round_robin and random policies",
    )
    p.add_argument(
        "--capture-sizes", help="graph mode: capture sizes, s0,s1,... (default: the contract's)"
    )
    p.add_argument(
        "--tile-cost-us",
        type=_tile_cost,
        help="issue 18: the expert kernel's row tiles beyond the table's balanced ones: "
        "'auto' (the default: each rank's table's own model where the policy gives per-expert "
        "counts and every table records one, else nothing), 'table' (that model, refused "
        "without one), 'none' (balanced loads), or us per tile (counting policies; "
        "docs/estimate.md)",
    )
    p = sub.add_parser("export", help="write the bundle for another simulator")
    p.add_argument("bundle")
    p.add_argument("--format", required=True, choices=("llmservingsim", "aiconfigurator"))
    p.add_argument("--out", required=True, help="an empty or new folder")
    args = parser.parse_args(argv)
    handler = {
        "validate": _validate,
        "info": _info,
        "lookup": _lookup,
        "estimate": _estimate,
        "export": _export,
    }[args.command]
    return handler(args, out or sys.stdout)
