"""Job parameters: the acquisition's options (`acquisition.options`) as a JSON object.

Nothing here declares an option: the validation, the argv a worker runs, the form fields and
the API serializer are all derived from `acquisition.options.OPTIONS`, so the registry refuses
exactly what the CLI refuses, each error filed under its parameter. `acquisition.options` is
pure (no torch, no vLLM, no device) and the only module of `acquisition` the registry imports.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from django.conf import settings
from rest_framework import serializers

from acquisition.options import (
    NON_FIELD,
    Option,
    OptionErrors,
    job_argv,
    job_options,
    validate_job,
)

__all__ = [
    "NON_FIELD",
    "JobParameterError",
    "JobParametersSerializer",
    "acquisition_argv",
    "job_parameter_fields",
    "queue_for",
    "validate_parameters",
]


class JobParameterError(OptionErrors):
    """Parameters the acquisition would refuse; ``errors`` is ``{field: [message, ...]}``."""


def job_parameter_fields() -> list[dict[str, Any]]:
    """The parameters with defaults and choices, for a form."""
    return [
        {
            "name": o.name,
            "kind": o.kind,
            "default": o.default,
            "required": o.required,
            "nullable": o.nullable,
            "choices": list(o.choices),
            "option": o.flag,
            "help": o.help,
        }
        for o in job_options()
    ]


def validate_parameters(raw: object) -> dict[str, Any]:
    """Parameters with defaults filled, or `JobParameterError` with every field's problem."""
    roots = settings.REGISTRY.get("JOB_MODEL_ROOTS", ())
    try:
        return validate_job(raw, model_roots=roots)
    except OptionErrors as exc:
        raise JobParameterError(exc.errors) from exc


def acquisition_argv(
    params: Mapping[str, Any], *, out_root: str | Path, progress_json: str | Path | None = None
) -> list[str]:
    """``python -m acquisition`` arguments for validated parameters."""
    return job_argv(params, out_root=out_root, progress_json=progress_json)


def queue_for(params: Mapping[str, Any]) -> str:
    """CPU runs (the torch reference) go to ``cpu``; device runs to ``gpu.<hardware>``."""
    if params.get("device") == "cpu":
        return "cpu"
    return f"gpu.{params['hardware']}"


def _field(option: Option) -> serializers.Field[Any, Any, Any, Any]:
    common: dict[str, Any] = {"help_text": option.help, "required": option.required}
    if option.nullable:
        common["allow_null"] = True
    if not option.required:
        common["default"] = option.default
    if option.kind == "ints":
        return serializers.ListField(child=serializers.IntegerField(), **common)
    if option.kind == "int":
        low = None if option.minimum is None else int(option.minimum)
        return serializers.IntegerField(min_value=low, **common)
    if option.kind == "float":
        return serializers.FloatField(min_value=option.minimum, **common)
    if option.choices:
        return serializers.ChoiceField(choices=list(option.choices), **common)
    return serializers.CharField(**common)


# The request body of POST /api/v1/jobs/, for the OpenAPI schema: one field per job option.
# Validation is `validate_parameters` (the options' own), which the service runs.
JobParametersSerializer: type[serializers.Serializer[Any]] = type(
    "JobParametersSerializer",
    (serializers.Serializer,),
    {
        "__doc__": "The parameters of an acquisition job (docs/jobs.md lists them).",
        **{o.name: _field(o) for o in job_options()},
    },
)
