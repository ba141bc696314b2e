"""A registry job's parameters: the job options as a JSON object, checked as the CLI checks
them (`validate_job`), the argv a worker runs (`job_argv`), its queue, and the docs table."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from acquisition.catalog import catalog_models
from acquisition.options.resolve import prepare
from acquisition.options.schema import (
    NON_FIELD,
    OPTIONS,
    AcquisitionOptions,
    OptionError,
    OptionErrors,
    coerce,
    job_options,
    shown,
)

__all__ = ["job_argv", "markdown_table", "validate_job"]


def _model_reference(name: str, roots: Sequence[str | Path]) -> str:
    """A catalog id as it is; a folder only below an allowed root (never any server path)."""
    if name in catalog_models():
        return name
    allowed = [Path(r).resolve() for r in roots]
    if allowed and Path(name).is_absolute():
        folder = Path(name).resolve()
        if any(folder.is_relative_to(root) for root in allowed) and folder.is_dir():
            return str(folder)
    raise OptionError(
        "model", f"unknown model {name!r}; the catalog has: {', '.join(catalog_models())}"
    )


def validate_job(raw: object, *, model_roots: Sequence[str | Path] = ()) -> dict[str, Any]:
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


def _job_options(
    params: Mapping[str, Any], *, out_root: Path, progress_json: Path | None = None
) -> AcquisitionOptions:
    values = {o.name: params.get(o.name, o.default) for o in OPTIONS}
    values.update(out_root=out_root, progress_json=progress_json, no_progress_bar=True)
    return AcquisitionOptions(**values)


def job_argv(
    params: Mapping[str, Any], *, out_root: str | Path, progress_json: str | Path | None = None
) -> list[str]:
    """``python -m acquisition`` arguments for a job's validated parameters."""
    argv = [str(params["command"]), str(params["model"])]
    for option in job_options():
        value = params.get(option.name, option.default)
        if option.flag is None or value is None:
            continue
        argv += [option.flag, shown(value)]
    argv += ["--out-root", str(out_root), "--no-progress-bar"]
    if progress_json is not None:
        argv += ["--progress-json", str(progress_json)]
    return argv


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
            default = f"`{shown(option.default)}`"
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
