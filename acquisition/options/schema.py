"""The acquisition's options, declared once: `OPTIONS`, their checked values
(`AcquisitionOptions`), how a raw value becomes a typed one (`coerce`), and the typed errors
that name their field (`OptionError`, `OptionErrors`)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Literal

from acquisition.plan import CudagraphMode
from acquisition.plan.grid import MINIMUM_FACTOR

__all__ = [
    "BACKEND_NAMES",
    "NON_FIELD",
    "OPTIONS",
    "OPTIONS_BY_NAME",
    "AcquisitionOptions",
    "Option",
    "OptionError",
    "OptionErrors",
    "coerce",
    "job_options",
    "shown",
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


# The choice set of the switches that default to the backend's own rule (one OpenAPI enum).
AUTO_ON_OFF = ("auto", "on", "off")
# --moe-kernel-steps: auto/on pick the default rule (v4: `resolve.DEFAULT_KERNEL_STEPS_RULE`),
# v2, v3, v4 name one (issue 20).
KERNEL_STEPS_CHOICES = (*AUTO_ON_OFF, "v2", "v3", "v4")


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
    Option(
        "command",
        "choice",
        "slice",
        None,
        "`slice` refreshes the MoE tables of `tp_refresh`; `profile` measures every `tp`",
        choices=("slice", "profile"),
    ),
    Option(
        "model",
        "str",
        None,
        None,
        "catalog id (e.g. `Qwen/Qwen3-30B-A3B-Instruct-2507`) or a folder with config.json "
        "(a job's folder must lie under a root listed in `REGISTRY_JOB_MODEL_ROOTS`)",
        required=True,
    ),
    Option(
        "hardware",
        "str",
        None,
        "--hardware",
        "hardware label of the bundle, e.g. H200 (letters, digits, `._-`); queue `gpu.<hardware>`",
        required=True,
    ),
    Option("tp", "ints", [1], "--tp", "session TP degrees; must include 1"),
    Option(
        "tp_refresh", "ints", None, "--tp-refresh", "slice: TP degree(s) to measure", nullable=True
    ),
    Option(
        "group", "choice", "moe", "--group", "the category to acquire", choices=("moe",), job=False
    ),
    Option("dp", "ints", [1], "--dp", "target DP degrees"),
    Option("ep", "ints", None, "--ep", "filter over the full-EP targets TP x DP", nullable=True),
    Option(
        "ranks",
        "ints",
        None,
        "--ranks",
        "measure only these EP ranks of the selected targets (a later run adds the others)",
        nullable=True,
        minimum=0,
    ),
    Option(
        "isolate_targets",
        "choice",
        "auto",
        "--isolate-targets",
        "measure each target in a fresh child process (auto: on for vllm-live and auto on cuda)",
        choices=AUTO_ON_OFF,
    ),
    Option(
        "max_num_batched_tokens",
        "int",
        2048,
        "--max-num-batched-tokens",
        "the serving deployment's token budget per step",
        minimum=1,
    ),
    Option(
        "max_num_seqs",
        "int",
        256,
        "--max-num-seqs",
        "the serving deployment's sequences per step (at most max_num_batched_tokens)",
        minimum=1,
    ),
    Option("rounds", "int", 3, "--moe-rounds", "independent contexts per point", minimum=1),
    Option(
        "iterations",
        "int",
        3,
        "--measurement-iterations",
        "minimum timed forwards per context",
        minimum=1,
    ),
    Option(
        "grid_factor",
        "float",
        2.0,
        "--moe-grid-factor",
        "ratio between neighbouring grid points",
        minimum=MINIMUM_FACTOR,
    ),
    Option(
        "kernel_steps",
        "choice",
        "auto",
        "--moe-kernel-steps",
        "add expert points on both sides of each switch of vLLM's Triton expert kernel "
        "configuration and at its block-padding corners in M (auto: on for the vLLM backends "
        "where the configuration is modelled; on/auto use rule v4; v2, v3, v4: that rule, v3 "
        "also measuring both edges of every padding ramp, v4 also the A values where the "
        "tiles bend along A at EP1's 16-row rows; v2 is the plan of the f2k tables)",
        choices=KERNEL_STEPS_CHOICES,
    ),
    Option(
        "out_root",
        "path",
        None,
        "--out-root",
        "bundles go to OUT/<hardware>/<model>/<variant>; samples to OUT/_acquisition",
        required=True,
        job=False,
    ),
    Option(
        "backend",
        "choice",
        "auto",
        "--backend",
        "the execution path (auto: the first adapter that admits the target)",
        choices=BACKEND_NAMES,
    ),
    Option(
        "device",
        "choice",
        "cuda",
        "--device",
        "`cpu` runs go to the `cpu` queue",
        choices=("cuda", "cpu"),
    ),
    Option(
        "dtype",
        "choice",
        "auto",
        "--dtype",
        "weight and activation dtype (auto: the config's torch_dtype)",
        choices=("auto", "bfloat16", "float16", "float32"),
    ),
    Option(
        "cudagraph_mode",
        "choice",
        CudagraphMode.FULL_AND_PIECEWISE.value,
        "--cudagraph-mode",
        "the serving deployment's CUDA graph mode (decides capture rules)",
        choices=tuple(m.value for m in CudagraphMode),
    ),
    Option(
        "cudagraph_capture_sizes",
        "ints",
        None,
        "--cudagraph-capture-sizes",
        "the serving deployment's capture sizes (default: derived like vLLM)",
        nullable=True,
        minimum=1,
        job=False,
    ),
    Option(
        "cache_bytes",
        "int",
        None,
        "--cache-bytes",
        "declare the cache size the weight banks must overflow (default: read)",
        nullable=True,
        minimum=1,
    ),
    Option(
        "warmup_cycles",
        "int",
        1,
        "--warmup-cycles",
        "complete 2B bank cycles of warmup per context",
    ),
    Option(
        "quality_tolerance", "float", 0.03, "--quality-tolerance", "B/2B pooled-median tolerance"
    ),
    Option(
        "control_attempts",
        "int",
        6,
        "--control-attempts",
        "measurements of a point whose control fails, per run",
        minimum=1,
        job=False,
    ),
    Option(
        "engine_attention_backend",
        "str",
        None,
        "--engine-attention-backend",
        "attention backend of a component engine (vllm-live; e.g. TRITON_ATTN)",
        nullable=True,
        job=False,
    ),
    Option(
        "engine_kv_cache_bytes",
        "int",
        None,
        "--engine-kv-cache-bytes",
        "KV cache bytes of a component engine (vllm-live; default 1 GiB, R31)",
        nullable=True,
        minimum=1,
        job=False,
    ),
    Option(
        "profile_batch",
        "int",
        8,
        "--profile-batch",
        "points measured in one profiler session (1: a session per point)",
        minimum=1,
        job=False,
    ),
    Option(
        "triton_precompile_workers",
        "int",
        8,
        "--triton-precompile-workers",
        "threads compiling the Triton expert kernels of a target's plan before its first point "
        "(vllm-modular, vllm-live; 0: each configuration compiles at first use, inside a point)",
        minimum=0,
        job=False,
    ),
    Option(
        "progress_json",
        "path",
        None,
        "--progress-json",
        "append JSON progress events to this file",
        nullable=True,
        job=False,
    ),
    Option(
        "phase_log",
        "path",
        None,
        "--phase-log",
        "append the run's wall seconds per phase as one JSON line (issue 19)",
        nullable=True,
        job=False,
    ),
    Option(
        "only_target",
        "str",
        None,
        "--only-target",
        "the one target an isolated child measures (set by the parent, e.g. tp1/dp8_ep8_rank7_sp0)",
        nullable=True,
        job=False,
        hidden=True,
    ),
    Option("no_progress_bar", "flag", False, "--no-progress-bar", "no progress bar", job=False),
    Option("dry_run", "flag", False, "--dry-run", "validate and plan, then stop", job=False),
    Option("force", "flag", False, "--force", "rejected: resume instead", job=False, hidden=True),
)
OPTIONS_BY_NAME = {o.name: o for o in OPTIONS}


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
    ranks: list[int] | None
    isolate_targets: str
    max_num_batched_tokens: int
    max_num_seqs: int
    rounds: int
    iterations: int
    grid_factor: float
    kernel_steps: str
    backend: str
    device: str
    dtype: str
    cudagraph_mode: str
    cudagraph_capture_sizes: list[int] | None
    cache_bytes: int | None
    warmup_cycles: int
    quality_tolerance: float
    control_attempts: int
    engine_attention_backend: str | None
    engine_kv_cache_bytes: int | None
    profile_batch: int
    triton_precompile_workers: int
    progress_json: Path | None
    phase_log: Path | None
    only_target: str | None
    no_progress_bar: bool
    dry_run: bool
    force: bool


assert {f.name for f in fields(AcquisitionOptions)} == set(OPTIONS_BY_NAME), "options out of step"


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
        raise OptionError(
            option.name, f"invalid choice: {text!r} (choose from {', '.join(option.choices)})"
        )
    if option.name == "hardware" and not _HARDWARE.match(text):
        raise OptionError(option.name, "letters, digits, '.', '_' and '-' only (at most 64)")
    return text


def shown(value: Any) -> str:
    if isinstance(value, list):
        return ",".join(str(v) for v in value)
    return str(value)
