"""Command-line flags for the recipes' option dataclasses (one flag per distinct field)."""

import argparse
import types
from dataclasses import fields
from typing import Any, Literal, Union, get_args, get_origin

from flipgate.errors import InputError
from flipgate.train.methods import METHODS

NONE_WORDS = ("none", "all")


def _converter(annotation: Any):
    """A string parser for int, float, str and their `| None` forms ("none"/"all" -> None)."""
    optional = get_origin(annotation) in (Union, types.UnionType)
    base = next(a for a in get_args(annotation) if a is not type(None)) if optional else annotation
    if get_origin(base) is Literal:  # the options object checks the choice
        base = str

    def convert(text: str):
        if optional and text.lower() in NONE_WORDS:
            return None
        try:
            return base(text)
        except ValueError as error:
            raise argparse.ArgumentTypeError(f"expected {base.__name__}, got {text!r}") from error

    convert.__name__ = base.__name__
    return convert


def _option_fields() -> dict[str, tuple[Any, list[str]]]:
    """field name -> (annotation, ["method (default)", ...]), over every recipe."""
    found: dict[str, tuple[Any, list[str]]] = {}
    for method, recipe in METHODS.items():
        for field in fields(recipe.options):
            shown = "unset" if field.default is None else field.default
            found.setdefault(field.name, (field.type, []))[1].append(f"{method} ({shown})")
    return found


def add_method_flags(parser: argparse.ArgumentParser) -> None:
    """Add --NAME for every recipe option; the help says which methods take it."""
    group = parser.add_argument_group(
        "method options (default per method in brackets; 'all' or 'none' unsets)")
    for name, (annotation, methods) in _option_fields().items():
        group.add_argument(f"--{name.replace('_', '-')}", dest=f"option_{name}", default=None,
                           type=_converter(annotation), metavar=name.upper(),
                           help=f"for {', '.join(methods)}")


def method_options(args: argparse.Namespace, method: str) -> Any:
    """The chosen recipe's options from the flags that were given; others are refused."""
    options_type = METHODS[method].options
    accepted = {field.name for field in fields(options_type)}
    given = {name: getattr(args, f"option_{name}") for name in _option_fields()
             if getattr(args, f"option_{name}") is not None}
    foreign = sorted(set(given) - accepted)
    if foreign:
        takes = ", ".join(f"--{n.replace('_', '-')}" for n in sorted(accepted)) or "no options"
        raise InputError("option_not_applicable", f"--{foreign[0].replace('_', '-')} does "
                           f"not apply to --method {method} (it takes {takes})")
    return options_type(**given)
