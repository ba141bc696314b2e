"""The acquisition's options, declared once (R6-R9): `schema` (the options, their values and
errors), `parser` (the CLI), `jobs` (a registry job's parameters, argv, docs table) and
`resolve` (options into a request and plans).

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

from acquisition.options.jobs import job_argv, markdown_table, validate_job
from acquisition.options.measurable import backend_target_problem, cell_problem, declared_reasons
from acquisition.options.parser import add_arguments, from_namespace
from acquisition.options.resolve import (
    command_line,
    default_components,
    plan_target,
    prepare,
    target_key,
)
from acquisition.options.schema import (
    BACKEND_NAMES,
    NON_FIELD,
    OPTIONS,
    AcquisitionOptions,
    Option,
    OptionError,
    OptionErrors,
    coerce,
    job_options,
)

__all__ = [
    "BACKEND_NAMES",
    "NON_FIELD",
    "OPTIONS",
    "AcquisitionOptions",
    "Option",
    "OptionError",
    "OptionErrors",
    "add_arguments",
    "backend_target_problem",
    "cell_problem",
    "coerce",
    "command_line",
    "declared_reasons",
    "default_components",
    "from_namespace",
    "job_argv",
    "job_options",
    "markdown_table",
    "plan_target",
    "prepare",
    "target_key",
    "validate_job",
]
