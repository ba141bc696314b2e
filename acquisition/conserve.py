"""``python -m acquisition conserve BUNDLE...``: conservation traces for tables published
without them (issue 14).

Since session 4 an acquisition's build traces the rank's whole MoE path and the bundle carries
those forwards as ``conservation.csv``; tables acquired before have none. This command builds,
for every such target, the backend its contract names (model, dtype, deployment rank, serving
limits, on the same device kind) exactly as the acquisition builds it, which runs the same
traces, and nothing else: no bank, no point is measured. The rows are attached to the bundle
as *supplementary* evidence (``moetables.bundle.attach_conservation``): marked so beside the
file's digest, with the contract's ``supplementary_conservation`` saying when, by which
command and on what hardware and software they were measured. Tables and stability files keep
their bytes; each bundle is staged, validated and swapped in whole, or not at all.

It refuses, before building anything, a target whose contract this host cannot honour (another
GPU, torch or vLLM version, an unknown backend, a changed model config) and a target that has
conservation rows already (``--replace`` re-traces supplementary ones; rows measured with the
table are never replaced). After building it refuses a path whose classes differ from the
contract's backend (the traces would describe another path).

All targets run in one process, in the order given: vLLM is imported once; the live path
starts one engine per target, and it only admits TP1/DP1, so one per model.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import acquisition
from moetables.bundle import TableEntry, open_bundle
from moetables.bundle.model import SUPPLEMENT_MEASURED
from moetables.errors import BundleError

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence

    from acquisition.adapters import ComponentBackend, RuntimeInfo
    from acquisition.catalog import MoeModel
    from acquisition.progress import ProgressReporter
    from moetables.bundle import ConservationRow

__all__ = [
    "IDENTITY_KEYS",
    "ConserveError",
    "Target",
    "add_arguments",
    "identity_mismatches",
    "out_path",
    "plan_targets",
    "run",
    "runtime_mismatches",
]

WRITTEN_BY = "python -m acquisition conserve"
# Fields of a contract's backend description that name the executed path. A rebuilt session
# must report the same values for every one the contract has, or its traces describe another
# path. Free-text fields (boundaries, notes) and host paths are left out on purpose.
IDENTITY_KEYS = (
    "name",
    "native",
    "vllm_version",
    "kernel_class",
    "expert_class",
    "prepare_finalize_class",
    "reduction_class",
    "native_backend",
    "prepare_finalize_kind",
    "all2all_backend",
    "router_class",
    "quant_method_class",
    "parent_class",
    "runner_class",
    "layer_path",
    "moe_parallel_config",
    "activation",
)
VLLM_BACKENDS = ("vllm-modular", "vllm-live")


class ConserveError(RuntimeError):
    """A target this command must not trace here; the message says why."""


@dataclass(frozen=True, slots=True)
class Target:
    """One table to trace: where it is, what its contract says, the model to build."""

    bundle: Path
    entry: TableEntry
    model: MoeModel

    @property
    def contract(self) -> dict[str, Any]:
        return self.entry.contract

    @property
    def backend(self) -> str:
        return str(self.contract["backend"]["name"])

    @property
    def provenance(self) -> dict[str, Any]:
        value = self.contract.get("provenance")
        return value if isinstance(value, dict) else {}

    @property
    def label(self) -> str:
        return f"{self.bundle}:{self.entry.target.deployment}"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("bundles", nargs="+", type=Path, help="current-layout variant folders")
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="write each updated bundle to OUT/<BUNDLE as given> instead of in place",
    )
    parser.add_argument(
        "--target",
        action="append",
        default=None,
        metavar="DEPLOYMENT",
        help="only these deployments (e.g. dp2_ep2_rank1_sp0; repeatable); default: every one",
    )
    parser.add_argument(
        "--replace",
        action="store_true",
        help="re-trace targets whose supplementary conservation rows exist already",
    )
    parser.add_argument(
        "--dry-run", action="store_true", help="check the bundles and list the targets only"
    )
    parser.add_argument("--progress-json", type=Path, default=None)
    parser.add_argument("--no-progress-bar", action="store_true")


def plan_targets(
    bundles: Sequence[Path], *, only: Sequence[str] | None = None, replace: bool = False
) -> list[Target]:
    """The targets to trace, every refusal that needs no device collected into one error."""
    from acquisition.adapters import backend_names
    from acquisition.catalog import resolve_model

    targets: list[Target] = []
    problems: list[str] = []
    for bundle in bundles:
        try:
            opened = open_bundle(bundle)
        except BundleError as exc:
            problems.append(f"{bundle}: {exc}")
            continue
        if opened.layout != "current":
            problems.append(f"{bundle}: a {opened.layout} bundle; only current bundles are traced")
            continue
        entries = [e for e in opened.entries if only is None or e.target.deployment in only]
        if not entries:
            problems.append(f"{bundle}: no target named {list(only or [])}")
        for entry in entries:
            where = f"{bundle}:{entry.target.deployment}"
            refs = entry.quality
            backend = entry.contract.get("backend")
            name = backend.get("name") if isinstance(backend, dict) else None
            if refs is None:
                problems.append(
                    f"{where}: format {entry.format_version}, no quality evidence: re-publish its "
                    "stability evidence first (python -m acquisition.evidence BUNDLE ARCHIVE), "
                    "which also writes conservation traced with the table where its contract has "
                    "them"
                )
                continue
            if refs.conservation is not None and not refs.conservation_supplementary:
                problems.append(f"{where}: has conservation rows measured with its table")
                continue
            if refs.conservation is not None and not replace:
                problems.append(
                    f"{where}: has supplementary conservation rows already (--replace re-traces)"
                )
                continue
            if name not in backend_names()[1:]:
                problems.append(f"{where}: the contract's backend {name!r} is not one this runs")
                continue
            assert isinstance(backend, dict)
            if backend.get("launch_ownership"):
                problems.append(
                    f"{where}: its contract holds the acquisition's own traces; re-publish them "
                    "with python -m acquisition.evidence BUNDLE ARCHIVE"
                )
                continue
            model_record = entry.contract.get("model") or {}
            source = str(model_record.get("source") or "")
            # A catalog id, or the local folder the acquisition read (``local:<path>``).
            name = source[6:] if source.startswith("local:") else str(model_record.get("name"))
            try:
                model = resolve_model(name)
            except Exception as exc:  # an unknown model is a refusal with its reason
                problems.append(f"{where}: model {model_record.get('name')!r}: {exc}")
                continue
            if model.config_sha256 != model_record.get("config_sha256"):
                problems.append(
                    f"{where}: the model config here ({model.config_sha256[:12]}) is not the "
                    f"table's ({str(model_record.get('config_sha256'))[:12]})"
                )
                continue
            targets.append(Target(Path(bundle), entry, model))
    if problems:
        raise ConserveError("refused:\n  " + "\n  ".join(problems))
    return targets


def runtime_mismatches(target: Target, runtime: RuntimeInfo, vllm_version: str | None) -> list[str]:
    """How this host differs from what the table's contract records (empty: none)."""
    recorded = target.provenance
    found: list[str] = []
    for key, here in (
        ("device", runtime.device),
        ("device_name", runtime.device_name),
        ("torch_version", runtime.torch_version),
    ):
        if recorded.get(key) != here:
            found.append(f"{key}: the table's {recorded.get(key)!r}, here {here!r}")
    if target.backend in VLLM_BACKENDS:
        wanted = target.contract["backend"].get("vllm_version")
        if wanted != vllm_version:
            found.append(f"vLLM version: the table's {wanted!r}, here {vllm_version!r}")
    return found


def identity_mismatches(contract_backend: Mapping[str, Any], built: Mapping[str, Any]) -> list[str]:
    found = [
        f"{key}: the table's {contract_backend[key]!r}, built {built.get(key)!r}"
        for key in IDENTITY_KEYS
        if key in contract_backend and contract_backend[key] != built.get(key)
    ]
    want_layout, got_layout = contract_backend.get("expert_layout"), built.get("expert_layout")
    if not isinstance(want_layout, dict):
        # The torch reference describes its layout in words: the words must agree.
        if want_layout is not None and want_layout != got_layout:
            found.append(f"expert_layout: the table's {want_layout!r}, built {got_layout!r}")
        return found
    for weight in ("w13", "w2"):
        want = _shape(want_layout, weight)
        got = _shape(got_layout, weight)
        if want is not None and want != got:
            found.append(f"expert_layout.{weight}.shape: the table's {want}, built {got}")
    return found


def _shape(layout: Any, weight: str) -> Any:
    record = layout.get(weight) if isinstance(layout, dict) else None
    return record.get("shape") if isinstance(record, dict) else None


def _installed_vllm() -> str | None:
    try:
        import vllm
    except ImportError:
        return None
    return str(vllm.__version__)


def _limits(target: Target) -> Any:
    from acquisition.adapters.base import EngineLimits

    raw = target.provenance.get("limits")
    if not isinstance(raw, dict) or not raw.get("max_num_batched_tokens"):
        raise ConserveError(f"{target.label}: the contract records no serving limits")
    return EngineLimits(
        max_num_batched_tokens=int(raw["max_num_batched_tokens"]),
        max_num_seqs=int(raw["max_num_seqs"]),
        max_model_len=raw.get("max_model_len"),
        kv_cache_memory_bytes=raw.get("kv_cache_memory_bytes"),
        attention_backend=raw.get("attention_backend"),
    )


def trace_target(
    target: Target, backend: ComponentBackend, runtime: RuntimeInfo, command_line: str
) -> tuple[list[ConservationRow], dict[str, Any]]:
    """Build the target's backend as the acquisition does (the build runs the traces), check
    the built path against the contract, and return the rows with their supplement."""
    from acquisition.acquire import release_target_memory
    from acquisition.evidence import conservation_evidence

    runtime = replace(runtime, limits=_limits(target))
    admission = backend.admit(target.model, target.entry.target, runtime)
    if not admission.admitted:
        raise ConserveError(f"{target.label}: {backend.name} declined: {list(admission.reasons)}")
    dtype = str(target.contract.get("geometry", {}).get("dtype") or target.model.dtype)
    measured_at = datetime.now(UTC).isoformat(timespec="seconds")
    started = time.perf_counter()
    session = backend.build(target.model, target.entry.target, runtime, dtype)
    try:
        built = session.describe()
    finally:
        phases = dict(getattr(session, "build_phases", None) or {})
        session.close()
        release_target_memory(runtime.device)
    seconds = time.perf_counter() - started
    wrong = identity_mismatches(target.contract["backend"], built)
    if wrong:
        raise ConserveError(f"{target.label}: the built path is not the table's: {wrong}")
    rows, absent = conservation_evidence(built)
    if absent is not None:
        raise ConserveError(f"{target.label}: the build traced no forward ({absent})")
    supplement: dict[str, Any] = {
        "measured": SUPPLEMENT_MEASURED,
        "measured_at": measured_at,
        "command_line": command_line,
        "written_by": WRITTEN_BY,
        "device_name": runtime.device_name,
        "uuid": runtime.uuid,
        "capability": list(runtime.capability) if runtime.capability else None,
        "host": runtime.host,
        "torch_version": runtime.torch_version,
        "cuda_version": runtime.cuda_version,
        "vllm_version": built.get("vllm_version"),
        "acquisition_version": acquisition.__version__,
        "limits": runtime.observations()["limits"],
        "table_measured_at": target.provenance.get("started_at"),
        "backend_checked": {k: built[k] for k in IDENTITY_KEYS if k in built},
        "build_seconds": round(seconds, 3),
        "trace_seconds": round(float(phases.get("build.conservation_traces", 0.0)), 3),
        "launch_ownership": built["launch_ownership"],
        "note": "traced by a later process that built this table's backend (same model, "
        "dtype, rank, serving limits, GPU kind, torch and vLLM version, the same classes) and "
        "ran only the acquisition's build-time traces; not measured in the table's own build",
    }
    return rows, supplement


def out_path(out: Path, bundle: Path) -> Path:
    """``OUT/<BUNDLE as given>``; an absolute bundle path must lie under the working folder."""
    if bundle.is_absolute():
        try:
            bundle = bundle.relative_to(Path.cwd())
        except ValueError:
            raise ConserveError(
                f"{bundle}: with --out, name bundles by paths under the working folder"
            ) from None
    return out / bundle


def _default_backend(name: str) -> ComponentBackend:
    from acquisition.adapters import BACKENDS

    return next(b for b in BACKENDS if b.name == name)


def run(
    targets: Sequence[Target],
    *,
    out: Path | None,
    replace_rows: bool,
    command_line: str,
    progress: ProgressReporter,
    backend_for: Callable[[str], ComponentBackend] = _default_backend,
    probe: Callable[[str], RuntimeInfo] | None = None,
    vllm_version: Callable[[], str | None] = _installed_vllm,
) -> tuple[list[Path], list[str]]:
    """Trace every target and attach the rows bundle by bundle; (written bundles, failures).

    A bundle is written only when all its targets traced; the others go on regardless.
    """
    from acquisition.runtime import probe_runtime
    from moetables.bundle import attach_conservation

    probe = probe or probe_runtime
    runtimes: dict[str, RuntimeInfo] = {}
    version: list[str | None] = []
    failures: list[str] = []
    written: list[Path] = []
    by_bundle: dict[Path, list[Target]] = {}
    for target in targets:
        by_bundle.setdefault(target.bundle, []).append(target)
    for bundle, group in by_bundle.items():
        traced: dict[Any, tuple[list[ConservationRow], dict[str, Any]]] = {}
        try:
            for target in group:
                progress.set_target(target.label)
                device = str(target.provenance.get("device"))
                if device not in runtimes:
                    runtimes[device] = probe(device)
                if target.backend in VLLM_BACKENDS and not version:
                    version.append(vllm_version())  # imports vLLM once
                wrong = runtime_mismatches(
                    target, runtimes[device], version[0] if version else None
                )
                if wrong:
                    raise ConserveError(f"{target.label}: this host is not the table's: {wrong}")
                progress.event("build", f"building {target.backend} for {target.label}")
                started = time.perf_counter()
                traced[target.entry.target] = trace_target(
                    target, backend_for(target.backend), runtimes[device], command_line
                )
                rows = traced[target.entry.target][0]
                progress.measured(
                    time.perf_counter() - started,
                    f"{target.label}: {len(rows)} forwards at {[r.tokens for r in rows]} rows",
                )
                progress.write(
                    f"{target.label}: traced {len(rows)} forwards in "
                    f"{time.perf_counter() - started:.1f}s"
                )
                for row in rows:
                    parts = ", ".join(f"{c} {t:.1f}" for c, t in row.components_us.items())
                    progress.write(
                        f"  {row.tokens} rows: whole {row.native_total_us:.1f} us = {parts}, "
                        f"outside the scopes {row.outside_scopes_us:.1f}"
                    )
            dest = None if out is None else out_path(out, bundle)
            progress.event("publish", f"attaching {len(traced)} targets' traces to {bundle}")
            note = {
                "written_by": WRITTEN_BY,
                "written_at": datetime.now(UTC).isoformat(timespec="seconds"),
                "command_line": command_line,
                "note": "conservation traces measured separately from the tables, for tables "
                "published without them; each contract's supplementary_conservation says how",
            }
            written.append(
                attach_conservation(bundle, traced, dest=dest, replace=replace_rows, note=note)
            )
            progress.write(f"{bundle}: wrote {len(traced)} conservation.csv, validated")
        except Exception as exc:  # a refusal or a failed build: this bundle only
            known = isinstance(exc, (ConserveError, BundleError, ValueError, OSError))
            text = str(exc) if known else f"{type(exc).__name__}: {exc}"
            if not text.startswith(str(bundle)):
                text = f"{bundle}: {text}"
            failures.append(text)
            progress.write(f"error: {text} (bundle left as it was)")
            progress.event("failed", f"{bundle} not written", error=text)
            progress.done += len(group) - len(traced)
    return written, failures
