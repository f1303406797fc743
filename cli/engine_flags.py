"""The engine flags on a command line: ``ServerArgs``' flag table as argparse arguments.

One ``--flag`` per ``ServerArgs`` field (its help, choices and default from the field's
metadata) and per registered prefill-policy flag (``roundgate.gate.registry``), so a new field
or policy flag is a new command-line flag without an edit here. ``to_argv`` is the inverse:
``parse_server_args(to_argv(args)) == args``.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from roundgate.actors.server_args import (
    CORE_FIELDS,
    ServerArgs,
    engine_arg_names,
    flag_fields,
    flag_name,
)
from roundgate.gate import registry
from roundgate.gate.spec import annotation_type


def add_engine_flags(parser: argparse.ArgumentParser, *, overrides: bool = False) -> None:
    """Add every engine flag to ``parser``.

    ``overrides``: no flag has a default in the namespace (only the flags given appear, as
    overrides of a config file's values); the help still names ``ServerArgs``' default.
    """
    group = parser.add_argument_group("engine flags (ServerArgs)")
    for f in flag_fields():
        default = argparse.SUPPRESS if overrides else f.default
        help_text = f.metadata["help"] + (f" (default: {f.default})" if overrides else "")
        if f.type in ("bool", bool):
            # (BooleanOptionalAction appends the default itself when it has one.)
            group.add_argument(
                flag_name(f.name),
                action=argparse.BooleanOptionalAction,
                default=default,
                help=f.metadata["help"] if not overrides else help_text,
            )
            continue
        if f.name == "prefill_policy":
            choices: Sequence[str] | None = registry.names()
        else:
            choices = f.metadata["choices"] or None
        group.add_argument(
            flag_name(f.name),
            type=annotation_type(f.type),
            default=default,
            choices=choices,
            help=help_text,
        )
    for flag, owner in registry.all_flags().values():
        default_text = "required" if flag.required else f"default {flag.default}"
        group.add_argument(
            flag.cli,
            type=flag.kind,
            default=argparse.SUPPRESS if overrides else None,
            help=f"{flag.help} (--prefill-policy {owner}; {default_text})",
        )


def engine_values(ns: argparse.Namespace) -> dict[str, Any]:
    """The engine flags in ``ns`` by name (fields and policy flags), as ``ServerArgs`` takes
    them; a policy flag left unset (None) is not given."""
    return {name: getattr(ns, name) for name in engine_arg_names() if hasattr(ns, name)}


def parse_server_args(argv: Sequence[str] | None = None) -> ServerArgs:
    """Parse ``argv``; an invalid value exits with an argparse error naming the flag."""
    parser = argparse.ArgumentParser(
        prog="roundgate",
        description="roundgate engine arguments",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    add_engine_flags(parser)
    ns = parser.parse_args(argv)
    try:
        return ServerArgs(**engine_values(ns))
    except ValueError as exc:
        parser.error(str(exc))
        raise  # unreachable: parser.error exits


def to_argv(args: ServerArgs) -> list[str]:
    """The argv that ``parse_server_args`` turns back into an equal ``ServerArgs``."""
    argv: list[str] = []
    for name, value in args.to_dict().items():
        if value is None:
            continue
        flag = flag_name(name)
        if isinstance(value, bool) and name in CORE_FIELDS:
            argv.append(flag if value else "--no-" + flag[2:])
        else:
            argv += [flag, str(value)]
    return argv
