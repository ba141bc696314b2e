"""The acquisition's options, declared once (R6-R9).

Everything that reads or writes an option derives from `OPTIONS`: the CLI parser
(`add_arguments`), a job's parameters and their validation (`validate_job`), the argv a worker
runs (`job_argv`), the jobs API serializer and web form (`registry.jobs.parameters`), and the
table in docs/jobs.md (`markdown_table`, checked by a test). Errors are typed and name their
field (`OptionError`, `OptionErrors`), so no caller reads a message to learn what went wrong.

`prepare` resolves checked options into a request and one point plan per target. Pure on
purpose: this module (and what it imports) needs neither torch nor vLLM nor a device, so a
registry validates a job exactly as the CLI would, and the registry imports no other module of
`acquisition`.
"""

from __future__ import annotations

import argparse
import re
import shlex
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Literal

from acquisition.catalog import CatalogError, catalog_models, resolve_model, variant_for_dtype
from acquisition.deployments import DegreeError, select_deployments, targets_for
from acquisition.plan import (
    CaptureSizes,
    CudagraphMode,
    PointPlan,
    build_plan,
    derived_capture_sizes,
)
from acquisition.plan.grid import MINIMUM_FACTOR
from acquisition.protocol.measure import ProtocolSettings
from acquisition.request import AcquisitionRequest
from moetables.bundle import EXPERTS
from moetables.geometry import ExpertGeometry, MoeTarget

__all__ = [
    "BACKEND_NAMES",
    "NON_FIELD",
    "OPTIONS",
    "AcquisitionOptions",
    "Option",
    "OptionError",
    "OptionErrors",
    "add_arguments",
    "default_components",
    "from_namespace",
    "job_argv",
    "job_options",
    "markdown_table",
    "plan_target",
    "prepare",
    "queue_for",
    "validate_job",
]

Kind = Literal["str", "int", "float", "ints", "choice", "path", "flag"]

NON_FIELD = "non_field_errors"
# The adapters' names (acquisition.adapters.backend_names(), checked equal by a test): listed
# here so that validating a job does not import the adapters.
BACKEND_NAMES = ("auto", "vllm-modular", "vllm-live", "torch-reference")
HARDWARE_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
_HARDWARE = re.compile(HARDWARE_PATTERN)


class OptionError(ValueError):
    """One option's problem: ``field`` is the option's name, ``message`` says what is wrong."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


class OptionErrors(ValueError):
    """Every problem of a set of options: ``errors`` is ``{field: [message, ...]}``."""

    def __init__(self, errors: Mapping[str, list[str]]) -> None:
        self.errors = {k: list(v) for k, v in errors.items()}
        super().__init__("; ".join(f"{k}: {' '.join(v)}" for k, v in self.errors.items()))


@dataclass(frozen=True, slots=True)
class Option:
    """One option: its name (a job parameter and the CLI's ``dest``), type, default, CLI flag."""

    name: str
    kind: Kind
    default: Any
    flag: str | None  # None: positional (model) or the subcommand (command)
    help: str
    choices: tuple[str, ...] = ()
    required: bool = False
    nullable: bool = False
    minimum: float | None = None  # inclusive bound of an int, ints item or float
    job: bool = True  # a parameter of a registry job (False: the worker or the CLI sets it)
    hidden: bool = False


OPTIONS: tuple[Option, ...] = (
    Option("command", "choice", "slice", None,
           "`slice` refreshes the MoE tables of `tp_refresh`; `profile` measures every `tp`",
           choices=("slice", "profile")),
    Option("model", "str", None, None,
           "catalog id (e.g. `Qwen/Qwen3-30B-A3B-Instruct-2507`) or a folder with config.json "
           "(a job's folder must lie under a root listed in `REGISTRY_JOB_MODEL_ROOTS`)",
           required=True),
    Option("hardware", "str", None, "--hardware",
           "hardware label of the bundle, e.g. H200 (letters, digits, `._-`); queue "
           "`gpu.<hardware>`", required=True),
    Option("tp", "ints", [1], "--tp", "session TP degrees; must include 1"),
    Option("tp_refresh", "ints", None, "--tp-refresh",
           "slice: TP degree(s) to measure", nullable=True),
    Option("group", "choice", "moe", "--group", "the category to acquire", choices=("moe",),
           job=False),
    Option("dp", "ints", [1], "--dp", "target DP degrees"),
    Option("ep", "ints", None, "--ep", "filter over the full-EP targets TP x DP", nullable=True),
    Option("max_num_batched_tokens", "int", 2048, "--max-num-batched-tokens",
           "the serving deployment's token budget per step", minimum=1),
    Option("max_num_seqs", "int", 256, "--max-num-seqs",
           "the serving deployment's sequences per step (at most max_num_batched_tokens)",
           minimum=1),
    Option("rounds", "int", 3, "--moe-rounds", "independent contexts per point", minimum=1),
    Option("iterations", "int", 3, "--measurement-iterations",
           "minimum timed forwards per context", minimum=1),
    Option("grid_factor", "float", 2.0, "--moe-grid-factor",
           "ratio between neighbouring grid points", minimum=MINIMUM_FACTOR),
    Option("out_root", "path", None, "--out-root",
           "bundles go to OUT/<hardware>/<model>/<variant>; samples to OUT/_acquisition",
           required=True, job=False),
    Option("backend", "choice", "auto", "--backend", "the execution path (auto: the first "
           "adapter that admits the target)", choices=BACKEND_NAMES),
    Option("device", "choice", "cuda", "--device", "`cpu` runs go to the `cpu` queue",
           choices=("cuda", "cpu")),
    Option("dtype", "choice", "auto", "--dtype",
           "weight and activation dtype (auto: the config's torch_dtype)",
           choices=("auto", "bfloat16", "float16", "float32")),
    Option("cudagraph_mode", "choice", CudagraphMode.FULL_AND_PIECEWISE.value,
           "--cudagraph-mode",
           "the serving deployment's CUDA graph mode (decides capture rules)",
           choices=tuple(m.value for m in CudagraphMode)),
    Option("cudagraph_capture_sizes", "ints", None, "--cudagraph-capture-sizes",
           "the serving deployment's capture sizes (default: derived like vLLM)",
           nullable=True, minimum=1, job=False),
    Option("cache_bytes", "int", None, "--cache-bytes",
           "declare the cache size the weight banks must overflow (default: read)",
           nullable=True, minimum=1),
    Option("warmup_cycles", "int", 1, "--warmup-cycles",
           "complete 2B bank cycles of warmup per context"),
    Option("quality_tolerance", "float", 0.03, "--quality-tolerance",
           "B/2B pooled-median tolerance"),
    Option("control_attempts", "int", 3, "--control-attempts",
           "measurements of a point whose control fails, per run", minimum=1, job=False),
    Option("progress_json", "path", None, "--progress-json",
           "append JSON progress events to this file", nullable=True, job=False),
    Option("no_progress_bar", "flag", False, "--no-progress-bar", "no progress bar", job=False),
    Option("dry_run", "flag", False, "--dry-run", "validate and plan, then stop", job=False),
    Option("force", "flag", False, "--force", "rejected: resume instead", job=False,
           hidden=True),
)
_BY_NAME = {o.name: o for o in OPTIONS}


@dataclass(frozen=True, slots=True)
class AcquisitionOptions:
    """Checked option values, one field per `Option` (same names)."""

    command: str
    model: str
    hardware: str
    out_root: Path
    tp: list[int]
    tp_refresh: list[int] | None
    group: str
    dp: list[int]
    ep: list[int] | None
    max_num_batched_tokens: int
    max_num_seqs: int
    rounds: int
    iterations: int
    grid_factor: float
    backend: str
    device: str
    dtype: str
    cudagraph_mode: str
    cudagraph_capture_sizes: list[int] | None
    cache_bytes: int | None
    warmup_cycles: int
    quality_tolerance: float
    control_attempts: int
    progress_json: Path | None
    no_progress_bar: bool
    dry_run: bool
    force: bool


assert {f.name for f in fields(AcquisitionOptions)} == set(_BY_NAME), "options out of step"


def job_options() -> tuple[Option, ...]:
    """The options a registry job takes as parameters (in order)."""
    return tuple(o for o in OPTIONS if o.job)


# -- values ---------------------------------------------------------------------------------


def _number(option: Option, value: object, kind: type[int] | type[float]) -> int | float:
    word = "an integer" if kind is int else "a number"
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise OptionError(option.name, f"expected {word}, got {value!r}")
    if kind is int and isinstance(value, float) and not value.is_integer():
        raise OptionError(option.name, f"expected {word}, got {value!r}")
    try:
        number: int | float = kind(value.strip() if isinstance(value, str) else value)
    except (TypeError, ValueError):
        raise OptionError(option.name, f"expected {word}, got {value!r}") from None
    if option.minimum is not None and not number >= option.minimum:
        if option.minimum == 1 and kind is int:
            raise OptionError(option.name, f"expected a positive integer, got {number}")
        raise OptionError(option.name, f"must be at least {option.minimum}, got {number}")
    return number


def coerce(option: Option, value: object) -> Any:
    """``value`` (CLI or form text, or a JSON value) as ``option``'s type; `OptionError` if not."""
    if value is None:
        if option.nullable:
            return None
        raise OptionError(option.name, "this field may not be null")
    if option.kind == "ints":
        items: object = value
        if isinstance(value, str):
            items = [part.strip() for part in value.split(",") if part.strip()]
        elif isinstance(value, int) and not isinstance(value, bool):
            items = [value]
        if not isinstance(items, list) or not items:
            raise OptionError(option.name, "expected comma-separated integers (at least one)")
        item = Option(option.name, "int", None, None, "", minimum=option.minimum)
        return [int(_number(item, v, int)) for v in items]
    if option.kind == "int":
        return int(_number(option, value, int))
    if option.kind == "float":
        return float(_number(option, value, float))
    if option.kind == "flag":
        if not isinstance(value, bool):
            raise OptionError(option.name, f"expected true or false, got {value!r}")
        return value
    if not isinstance(value, str) or not value.strip():
        raise OptionError(option.name, "expected a non-empty string")
    text = value.strip()
    if option.kind == "path":
        return Path(text)
    if option.choices and text not in option.choices:
        raise OptionError(option.name, f"invalid choice: {text!r} (choose from "
                                       f"{', '.join(option.choices)})")
    if option.name == "hardware" and not _HARDWARE.match(text):
        raise OptionError(option.name, "letters, digits, '.', '_' and '-' only (at most 64)")
    return text


def _argparse_type(option: Option) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        try:
            return coerce(option, text)
        except OptionError as exc:
            raise argparse.ArgumentTypeError(exc.message) from None

    parse.__name__ = option.kind  # argparse names the type in its "invalid value" message
    return parse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of one ``python -m acquisition profile|slice`` subcommand."""
    model = _BY_NAME["model"]
    parser.add_argument(
        "model", type=_argparse_type(model),
        help=f"catalog id ({', '.join(catalog_models())}) or a folder with config.json",
    )
    for option in OPTIONS:
        if option.flag is None:
            continue
        help_text = argparse.SUPPRESS if option.hidden else option.help
        if option.kind == "flag":
            parser.add_argument(option.flag, dest=option.name, action="store_true",
                                help=help_text)
            continue
        default = list(option.default) if isinstance(option.default, list) else option.default
        if option.default is not None and not option.hidden:
            help_text = f"{help_text} (default {_shown(option.default)})"
        parser.add_argument(
            option.flag,
            dest=option.name,
            type=_argparse_type(option) if not option.choices else None,
            choices=option.choices or None,
            default=default,
            required=option.required,
            help=help_text,
        )


def from_namespace(args: argparse.Namespace) -> AcquisitionOptions:
    """The parsed CLI arguments as typed options."""
    return AcquisitionOptions(**{f.name: getattr(args, f.name) for f in fields(AcquisitionOptions)})


def _shown(value: Any) -> str:
    if isinstance(value, list):
        return ",".join(str(v) for v in value)
    return str(value)


# -- jobs -----------------------------------------------------------------------------------


def _model_reference(name: str, roots: Sequence[str | Path]) -> str:
    """A catalog id as it is; a folder only below an allowed root (never any server path)."""
    if name in catalog_models():
        return name
    allowed = [Path(r).resolve() for r in roots]
    if allowed and Path(name).is_absolute():
        folder = Path(name).resolve()
        if any(folder.is_relative_to(root) for root in allowed) and folder.is_dir():
            return str(folder)
    raise OptionError("model", f"unknown model {name!r}; the catalog has: "
                               f"{', '.join(catalog_models())}")


def validate_job(raw: Mapping[str, Any], *, model_roots: Sequence[str | Path] = ()
                 ) -> dict[str, Any]:
    """A job's parameters, checked as the CLI checks them, defaults filled in.

    Raises `OptionErrors` with every field's problem. ``model_roots``: the folders under which
    a model folder (instead of a catalog id) is allowed.
    """
    if not isinstance(raw, Mapping):
        raise OptionErrors({NON_FIELD: ["expected an object of parameters"]})
    errors: dict[str, list[str]] = {}
    for name in sorted(set(raw) - {o.name for o in job_options()}):
        errors[name] = ["unknown parameter"]
    params: dict[str, Any] = {}
    for option in job_options():
        if option.name not in raw:
            if option.required:
                errors[option.name] = ["this field is required"]
            else:
                default = option.default
                params[option.name] = list(default) if isinstance(default, list) else default
            continue
        try:
            params[option.name] = coerce(option, raw[option.name])
            if option.name == "model":
                params["model"] = _model_reference(params["model"], model_roots)
        except OptionError as exc:
            errors[exc.field] = [exc.message]
    if params.get("command") == "slice" and params.get("tp_refresh") is None:
        params["tp_refresh"] = [1]
    if errors:
        raise OptionErrors(errors)
    try:
        prepare(_job_options(params, out_root=Path("/nonexistent/validation-only")))
    except OptionError as exc:
        raise OptionErrors({exc.field: [exc.message]}) from exc
    return params


def _job_options(params: Mapping[str, Any], *, out_root: Path,
                 progress_json: Path | None = None) -> AcquisitionOptions:
    values = {o.name: params.get(o.name, o.default) for o in OPTIONS}
    values.update(out_root=out_root, progress_json=progress_json, no_progress_bar=True)
    return AcquisitionOptions(**values)


def job_argv(params: Mapping[str, Any], *, out_root: str | Path,
             progress_json: str | Path | None = None) -> list[str]:
    """``python -m acquisition`` arguments for a job's validated parameters."""
    argv = [str(params["command"]), str(params["model"])]
    for option in job_options():
        value = params.get(option.name, option.default)
        if option.flag is None or value is None:
            continue
        argv += [option.flag, _shown(value)]
    argv += ["--out-root", str(out_root), "--no-progress-bar"]
    if progress_json is not None:
        argv += ["--progress-json", str(progress_json)]
    return argv


def queue_for(params: Mapping[str, Any]) -> str:
    """CPU runs (the torch reference) go to ``cpu``; device runs to ``gpu.<hardware>``."""
    if params.get("device") == "cpu":
        return "cpu"
    return f"gpu.{params['hardware']}"


def markdown_table() -> str:
    """The parameters table of docs/jobs.md (a test keeps the document equal to it)."""
    rows = ["| name | default | CLI option | meaning |", "| --- | --- | --- | --- |"]
    for option in job_options():
        if option.required:
            default = "required"
        elif option.default is None:
            default = "`null`"
        elif isinstance(option.default, list):
            default = f"`{option.default}`"
        else:
            default = f"`{_shown(option.default)}`"
        if option.name == "tp_refresh":
            default = "`[1]` for slice, `null` for profile"
        flag = f"`{option.flag}`" if option.flag else "positional"
        if option.name == "command":
            flag = "subcommand"
        meaning = option.help
        if option.choices and option.name != "command":
            meaning += "; one of " + ", ".join(f"`{c}`" for c in option.choices)
        rows.append(f"| `{option.name}` | {default} | {flag} | {meaning} |")
    return "\n".join(rows) + "\n"


# -- resolution -----------------------------------------------------------------------------


def prepare(options: AcquisitionOptions, command_line: str = ""
            ) -> tuple[AcquisitionRequest, list[PointPlan]]:
    """Resolve checked options into a request and one plan per target; no torch involved.

    Raises `OptionError` naming the field at fault.
    """
    if options.force:
        raise OptionError("force", "--force is rejected: resume the original acquisition, or "
                                   "choose another --out-root for a new measurement")
    try:
        model = resolve_model(options.model)
    except CatalogError as exc:
        raise OptionError("model", str(exc)) from exc
    dtype = options.dtype if options.dtype != "auto" else model.dtype
    if dtype is None:
        raise OptionError("dtype", f"{model.name}: config.json names no torch_dtype; pass --dtype")
    try:
        variant = variant_for_dtype(dtype)
    except CatalogError as exc:
        raise OptionError("dtype", str(exc)) from exc
    try:
        deployments = select_deployments(
            options.command, options.tp, options.tp_refresh, options.dp, options.ep
        )
        targets = targets_for(model, deployments)
    except DegreeError as exc:
        raise OptionError(exc.field, str(exc)) from exc
    if options.max_num_seqs > options.max_num_batched_tokens:
        raise OptionError(
            "max_num_seqs",
            f"--max-num-seqs {options.max_num_seqs} exceeds --max-num-batched-tokens "
            f"{options.max_num_batched_tokens}; vLLM refuses such limits",
        )
    settings = ProtocolSettings(
        rounds=options.rounds,
        iterations=options.iterations,
        warmup_cycles=options.warmup_cycles,
        tolerance=options.quality_tolerance,
        attempts=options.control_attempts,
    )
    if options.cudagraph_capture_sizes:
        bad = [s for s in options.cudagraph_capture_sizes if s < 1]
        if bad:
            raise OptionError("cudagraph_capture_sizes",
                              f"--cudagraph-capture-sizes must be positive, got {bad}")
        captures = CaptureSizes(tuple(sorted(set(options.cudagraph_capture_sizes))),
                                "target_option")
    else:
        captures = derived_capture_sizes(options.max_num_seqs, options.max_num_batched_tokens)
    request = AcquisitionRequest(
        command=options.command,
        model=model,
        hardware=options.hardware,
        dtype=dtype,
        variant=variant,
        out_root=options.out_root,
        backend=options.backend,
        device=options.device,
        settings=settings,
        max_num_batched_tokens=options.max_num_batched_tokens,
        max_num_seqs=options.max_num_seqs,
        grid_factor=options.grid_factor,
        cudagraph_mode=CudagraphMode(options.cudagraph_mode),
        captures=captures,
        cache_bytes=options.cache_bytes,
        command_line=command_line,
    )
    try:
        plans = [plan_target(request, target, default_components(target)) for target in targets]
    except ValueError as exc:
        raise OptionError(NON_FIELD, str(exc)) from exc
    return request, plans


def command_line(argv: Sequence[str]) -> str:
    return shlex.join(["python", "-m", "acquisition", *argv])


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
