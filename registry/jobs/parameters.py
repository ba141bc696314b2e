"""Job parameters: the CLI's options as a JSON object, checked by the CLI's own code.

Types and ranges are checked here field by field; then the parameters are turned into the very
argv a worker will run and given to ``acquisition.cli``'s parser and ``prepare`` (pure: they
resolve the model, the TP/DP/EP deployments and the point plan without torch or a device), so
the registry refuses exactly what the CLI refuses. Each error is filed under its parameter.
"""

from __future__ import annotations

import contextlib
import io
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from django.conf import settings

__all__ = [
    "PARAMETERS",
    "JobParameterError",
    "acquisition_argv",
    "job_parameter_fields",
    "queue_for",
    "validate_parameters",
]

NON_FIELD = "non_field_errors"
_HARDWARE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


class JobParameterError(ValueError):
    """Parameters the acquisition would refuse; ``errors`` is ``{field: [message, ...]}``."""

    def __init__(self, errors: dict[str, list[str]]) -> None:
        super().__init__("; ".join(f"{k}: {' '.join(v)}" for k, v in errors.items()))
        self.errors = errors


@dataclass(frozen=True, slots=True)
class Parameter:
    name: str
    kind: str  # "str", "int", "float", "ints", "choice"
    default: Any
    option: str | None  # the CLI option; None for the positional model and the command
    choices: tuple[str, ...] = ()
    required: bool = False
    nullable: bool = False


PARAMETERS: tuple[Parameter, ...] = (
    Parameter("command", "choice", "slice", None, choices=("slice", "profile")),
    Parameter("model", "str", None, None, required=True),
    Parameter("hardware", "str", None, "--hardware", required=True),
    Parameter("tp", "ints", [1], "--tp"),
    Parameter("tp_refresh", "ints", None, "--tp-refresh", nullable=True),
    Parameter("dp", "ints", [1], "--dp"),
    Parameter("ep", "ints", None, "--ep", nullable=True),
    Parameter("max_num_batched_tokens", "int", 2048, "--max-num-batched-tokens"),
    Parameter("max_num_seqs", "int", 256, "--max-num-seqs"),
    Parameter("rounds", "int", 3, "--moe-rounds"),
    Parameter("iterations", "int", 3, "--measurement-iterations"),
    Parameter("grid_factor", "float", 2.0, "--moe-grid-factor"),
    Parameter("backend", "str", "auto", "--backend"),
    Parameter("device", "choice", "cuda", "--device", choices=("cuda", "cpu")),
    Parameter("dtype", "choice", "auto", "--dtype",
              choices=("auto", "bfloat16", "float16", "float32")),
    Parameter("cudagraph_mode", "str", "FULL_AND_PIECEWISE", "--cudagraph-mode"),
    Parameter("warmup_cycles", "int", 1, "--warmup-cycles"),
    Parameter("quality_tolerance", "float", 0.03, "--quality-tolerance"),
    Parameter("cache_bytes", "int", None, "--cache-bytes", nullable=True),
)
_BY_OPTION = {p.option: p.name for p in PARAMETERS if p.option}


def job_parameter_fields() -> list[dict[str, Any]]:
    """The parameters with defaults and choices, for a form."""
    from acquisition.adapters import backend_names
    from acquisition.plan import CudagraphMode

    choices = {"backend": tuple(backend_names()), "cudagraph_mode": tuple(m.value for m in
                                                                          CudagraphMode)}
    return [
        {
            "name": p.name, "kind": p.kind, "default": p.default, "required": p.required,
            "nullable": p.nullable, "choices": list(choices.get(p.name, p.choices)),
            "option": p.option,
        }
        for p in PARAMETERS
    ]


def _coerce(p: Parameter, value: Any) -> Any:
    if value is None:
        if p.nullable:
            return None
        raise ValueError("this field may not be null")
    if p.kind == "ints":
        if isinstance(value, str):
            value = [part.strip() for part in value.split(",") if part.strip()]
        if isinstance(value, int) and not isinstance(value, bool):
            value = [value]
        if not isinstance(value, list) or not value:
            raise ValueError("expected a non-empty list of integers")
        out = []
        for item in value:
            if isinstance(item, bool) or not isinstance(item, int | str):
                raise ValueError("expected a non-empty list of integers")
            out.append(int(item))
        return out
    if p.kind == "int":
        if isinstance(value, bool) or not isinstance(value, int | str):
            raise ValueError("expected an integer")
        return int(value)
    if p.kind == "float":
        if isinstance(value, bool) or not isinstance(value, int | float | str):
            raise ValueError("expected a number")
        return float(value)
    if not isinstance(value, str) or not value.strip():
        raise ValueError("expected a non-empty string")
    value = value.strip()
    if p.choices and value not in p.choices:
        raise ValueError(f"expected one of {', '.join(p.choices)}")
    return value


def _model_reference(name: str) -> str:
    """A catalog id as it is; a folder only below an allowed root (never any server path)."""
    from acquisition.catalog import catalog_models

    if name in catalog_models():
        return name
    roots = [Path(r).resolve() for r in settings.REGISTRY.get("JOB_MODEL_ROOTS", ())]
    if roots and Path(name).is_absolute():
        folder = Path(name).resolve()
        if any(folder.is_relative_to(root) for root in roots) and folder.is_dir():
            return str(folder)
    known = ", ".join(catalog_models())
    raise ValueError(f"unknown model {name!r}; the catalog has: {known}")


def acquisition_argv(
    params: Mapping[str, Any], *, out_root: str | Path, progress_json: str | Path | None = None
) -> list[str]:
    """``python -m acquisition`` arguments for validated parameters."""
    argv = [str(params["command"]), str(params["model"])]
    for p in PARAMETERS:
        if p.option is None:
            continue
        value = params.get(p.name, p.default)
        if value is None:
            continue
        text = ",".join(str(v) for v in value) if p.kind == "ints" else str(value)
        argv += [p.option, text]
    argv += ["--out-root", str(out_root), "--no-progress-bar"]
    if progress_json is not None:
        argv += ["--progress-json", str(progress_json)]
    return argv


def _field_of(message: str) -> str:
    """The parameter an acquisition error message is about (its first CLI option)."""
    for option in re.findall(r"--[a-z][a-z-]*", message):
        if option in _BY_OPTION:
            return _BY_OPTION[option]
    lowered = message.lower()
    if "unknown model" in lowered or "config.json" in lowered or "catalog" in lowered:
        return "model"
    return NON_FIELD


def _cli_check(params: dict[str, Any]) -> dict[str, list[str]]:
    # Imported here: a registry that never queues a job does not load the acquisition code.
    from acquisition.catalog import CatalogError
    from acquisition.cli import build_parser, prepare
    from acquisition.deployments import DegreeError

    argv = acquisition_argv(params, out_root="/nonexistent/validation-only")
    parser = build_parser()
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            args = parser.parse_args(argv)
    except SystemExit:
        line = stderr.getvalue().strip().splitlines()[-1:] or ["invalid command"]
        message = re.sub(r"^.*?error: ", "", line[0])
        match = re.search(r"argument (--[a-z-]+)", message)
        field = _BY_OPTION.get(match.group(1), NON_FIELD) if match else _field_of(message)
        if field == NON_FIELD and "model" in message:
            field = "model"
        return {field: [re.sub(r"^argument [^:]+: ", "", message)]}
    try:
        prepare(args, argv)
    except CatalogError as exc:
        return {"model": [str(exc)]}
    except (DegreeError, ValueError) as exc:
        return {_field_of(str(exc)): [str(exc)]}
    return {}


def validate_parameters(raw: Mapping[str, Any]) -> dict[str, Any]:
    """Parameters with defaults filled, or `JobParameterError` with every field's problem."""
    if not isinstance(raw, Mapping):
        raise JobParameterError({NON_FIELD: ["expected an object of parameters"]})
    errors: dict[str, list[str]] = {}
    unknown = sorted(set(raw) - {p.name for p in PARAMETERS})
    for name in unknown:
        errors[name] = ["unknown parameter"]
    params: dict[str, Any] = {}
    for p in PARAMETERS:
        if p.name not in raw:
            if p.required:
                errors[p.name] = ["this field is required"]
                continue
            params[p.name] = list(p.default) if isinstance(p.default, list) else p.default
            continue
        try:
            params[p.name] = _coerce(p, raw[p.name])
        except (TypeError, ValueError) as exc:
            message = str(exc)
            if message.startswith(("invalid literal", "could not convert")):
                message = "expected an integer" if p.kind in ("int", "ints") else "expected a number"
            errors[p.name] = [message]
    if "hardware" in params and not _HARDWARE.match(params["hardware"]):
        errors["hardware"] = ["letters, digits, '.', '_' and '-' only (at most 64)"]
    if "model" in params:
        try:
            params["model"] = _model_reference(params["model"])
        except ValueError as exc:
            errors["model"] = [str(exc)]
    if params.get("command") == "slice" and params.get("tp_refresh") is None:
        params["tp_refresh"] = [1]
    if errors:
        raise JobParameterError(errors)
    errors = _cli_check(params)
    if errors:
        raise JobParameterError(errors)
    return params


def queue_for(params: Mapping[str, Any]) -> str:
    """CPU runs (the torch reference) go to ``cpu``; device runs to ``gpu.<hardware>``."""
    if params.get("device") == "cpu":
        return "cpu"
    return f"gpu.{params['hardware']}"
