"""The CLI's arguments of one ``python -m acquisition profile|slice`` subcommand, from
`OPTIONS`, and the parsed namespace as typed options."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import fields
from typing import Any

from acquisition.catalog import catalog_models
from acquisition.options.schema import (
    OPTIONS,
    OPTIONS_BY_NAME,
    AcquisitionOptions,
    Option,
    OptionError,
    coerce,
    shown,
)

__all__ = ["add_arguments", "from_namespace"]


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
    model = OPTIONS_BY_NAME["model"]
    parser.add_argument(
        "model",
        type=_argparse_type(model),
        help=f"catalog id ({', '.join(catalog_models())}) or a folder with config.json",
    )
    for option in OPTIONS:
        if option.flag is None:
            continue
        help_text = argparse.SUPPRESS if option.hidden else option.help
        if option.kind == "flag":
            parser.add_argument(option.flag, dest=option.name, action="store_true", help=help_text)
            continue
        default = list(option.default) if isinstance(option.default, list) else option.default
        if option.default is not None and not option.hidden:
            help_text = f"{help_text} (default {shown(option.default)})"
        typed: dict[str, Any] = (
            {"choices": option.choices} if option.choices else {"type": _argparse_type(option)}
        )
        parser.add_argument(
            option.flag,
            dest=option.name,
            default=default,
            required=option.required,
            help=help_text,
            **typed,
        )


def from_namespace(args: argparse.Namespace) -> AcquisitionOptions:
    """The parsed CLI arguments as typed options."""
    return AcquisitionOptions(**{f.name: getattr(args, f.name) for f in fields(AcquisitionOptions)})
