"""``roundgate serve [MODEL] [flags]``: a serve config, with any engine or app flag overriding it.

The flags are derived, never listed by hand: one per ``ServerArgs`` field and policy flag
(``roundgate.cli.engine_flags``) and one per ``AppArgs`` field (``roundgate.deployment.config``),
help from their declarations. Only the flags given override the config file's args
(``roundgate.deployment.local.apply_overrides``); the args are validated once, and a refusal
is an argparse error naming the flag.
"""

from __future__ import annotations

import argparse
import json
import os
import types
import typing
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from pydantic.fields import FieldInfo

from roundgate.actors.server_args import flag_fields, flag_name
from roundgate.cli.engine_flags import add_engine_flags, engine_values
from roundgate.deployment.config import AppArgs
from roundgate.deployment.local import DEFAULT_CONFIG
from roundgate.gate import registry as policies
from roundgate.routing import registry as routers

# AppArgs keys that are sections of a config file, not flags: the engine's (its flags are the
# engine flags) and the P/D roles' (a P/D deployment is a config file, deployment/configs/pd.yaml).
CONFIG_ONLY = ("engine", "prefill", "decode")
ROUTER_SETTINGS = frozenset(option.name for option in routers.options("serve"))


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """The ``serve`` subcommand on ``sub`` (the ``roundgate`` command's subparsers)."""
    serve = sub.add_parser(
        "serve",
        help="serve a model on a local Ray cluster (127.0.0.1:8000), OpenAI-compatible",
        usage="roundgate serve [MODEL] [--config FILE] [--address HOST:PORT] [--FLAG VALUE ...]",
        description="Serve MODEL with the config file's settings: every flag given overrides "
        "the file's value, and a setting neither gives keeps the default shown (docs/cli.md).",
    )
    serve.add_argument(
        "model_positional",
        nargs="?",
        metavar="MODEL",
        help="a preset name, a Hugging Face model directory or a GGUF file (= --model)",
    )
    serve.add_argument(
        "--config",
        type=Path,
        default=DEFAULT_CONFIG,
        help="a `serve run` config whose args the flags override "
        "(default: deployment/configs/local.yaml)",
    )
    serve.add_argument(
        "--address",
        default=None,
        help="join this running Ray cluster (host:port of its head; default $RAY_ADDRESS) "
        "instead of starting a local one; stopping removes only the app",
    )
    add_engine_flags(serve, overrides=True)
    add_app_flags(serve)
    serve.set_defaults(func=run, parser=serve)
    return serve


def add_app_flags(parser: argparse.ArgumentParser) -> None:
    """One ``--flag`` per ``AppArgs`` field but the config's sections; none has a default in
    the namespace (only the flags given override the config file)."""
    app = parser.add_argument_group("app flags (how the engine is served: AppArgs)")
    routing = parser.add_argument_group("router flags (deployment/configs keys of the routers)")
    for name, info in AppArgs.model_fields.items():
        if name in CONFIG_ONLY:
            continue
        group = routing if name in ROUTER_SETTINGS or name == "router" else app
        group.add_argument(
            "--" + name.replace("_", "-"), default=argparse.SUPPRESS, **_argument(name, info)
        )


def _argument(name: str, info: FieldInfo) -> dict[str, Any]:
    """argparse's keywords for one ``AppArgs`` field, from its annotation and description."""
    kind = _non_none(info.annotation)
    default = info.get_default(call_default_factory=True)
    help_text = f"{info.description or name.replace('_', ' ')} (default: {default})"
    if kind is bool:
        return {"action": argparse.BooleanOptionalAction, "help": info.description}
    if typing.get_origin(kind) is typing.Literal:
        return {"choices": typing.get_args(kind), "help": help_text}
    if kind in (int, float, str):
        return {"type": kind, "help": help_text}
    if name == "api_key":  # str | list[str]: the flag given again adds a key
        return {"action": "append", "metavar": "KEY", "help": help_text + "; repeat for more"}
    if typing.get_origin(kind) is list:  # a list of ints: 8,1,1,1
        return {"type": _int_list, "metavar": "N,N,...", "help": help_text}
    return {"type": _json, "metavar": "JSON", "help": help_text + "; as JSON"}


def _non_none(annotation: Any) -> Any:
    """``X`` of ``X | None`` (and of ``str | list[str] | None``: the first member)."""
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        members = [a for a in typing.get_args(annotation) if a is not type(None)]
        return members[0] if len(members) == 1 else annotation
    return annotation


def _int_list(text: str) -> list[int]:
    try:
        return [int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected integers joined by commas: {text!r}") from None


def _json(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not JSON ({exc.msg}): {text!r}") from None


def overrides(ns: argparse.Namespace) -> dict[str, Any]:
    """The flags given in ``ns``, by config key (MODEL is ``model``); one ``--api-key``
    is a string, several a list."""
    values = engine_values(ns)
    for name in AppArgs.model_fields:
        if name not in CONFIG_ONLY and hasattr(ns, name):
            values[name] = getattr(ns, name)
    if ns.model_positional is not None:
        if "model" in values and values["model"] != ns.model_positional:
            raise ValueError(f"MODEL {ns.model_positional} and --model {values['model']} differ")
        values["model"] = ns.model_positional
    keys = values.get("api_key")
    if isinstance(keys, list) and len(keys) == 1:
        values["api_key"] = keys[0]
    return values


def describe(exc: ValueError) -> str:
    """A refusal's message with each key as its flag (pydantic names the key: ``num_groups``
    becomes ``--num-groups``; the engine's refusals name their flag already)."""
    if not isinstance(exc, ValidationError):
        return str(exc)
    lines = []
    for error in exc.errors():
        message = error["msg"].removeprefix("Value error, ")
        loc = [str(part) for part in error["loc"]]
        if loc and loc[0] in AppArgs.model_fields and loc[0] not in CONFIG_ONLY:
            message = f"--{loc[0].replace('_', '-')}: {message}"
        elif loc:
            message = f"{'.'.join(loc)}: {message}"
        lines.append(message)
    return "; ".join(lines)


# docs/cli.md holds ``flag_reference()`` between these lines (tests/test_serve_cli.py checks).
REFERENCE_BEGIN = "<!-- flag tables: generated by `python -m roundgate.cli.serve` -->"
REFERENCE_END = "<!-- end of the generated flag tables -->"


def flag_reference() -> str:
    """The serve flags as Markdown tables, from the same declarations as the parser."""
    rows = [
        "### Engine flags (`ServerArgs`)",
        "",
        "| flag | default | what |",
        "| --- | --- | --- |",
    ]
    for f in flag_fields():
        choices = f" ({', '.join(f.metadata['choices'])})" if f.metadata["choices"] else ""
        rows.append(_row(flag_name(f.name), f.default, f.metadata["help"] + choices))
    rows += ["", "### Prefill-policy flags", ""]
    rows += ["| flag | policy | default | what |", "| --- | --- | --- | --- |"]
    for flag, owner in policies.all_flags().values():
        default = "required" if flag.required else flag.default
        rows.append(f"| `{flag.cli}` | {owner} | {default} | {_cell(flag.help)} |")
    rows += ["", "### App flags (`AppArgs`)", "", "| flag | default | what |"]
    rows.append("| --- | --- | --- |")
    for name, info in AppArgs.model_fields.items():
        if name not in CONFIG_ONLY:
            what = info.description or name.replace("_", " ")
            default = info.get_default(call_default_factory=True)
            rows.append(_row(flag_name(name), default, what))
    return "\n".join(rows) + "\n"


def _row(flag: str, default: Any, what: str) -> str:
    return f"| `{flag}` | {_cell(str(default))} | {_cell(what)} |"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("``", "`")


def run(ns: argparse.Namespace) -> int:
    """``roundgate serve``: deploy the config with the flags given, serve until a signal."""
    from roundgate.deployment.local import serve_forever

    address = ns.address or os.environ.get("RAY_ADDRESS")
    try:
        return serve_forever(ns.config, overrides(ns), address=address)
    except ValueError as exc:
        ns.parser.error(describe(exc))
        return 2


if __name__ == "__main__":  # regenerate docs/cli.md's flag tables
    path = Path(__file__).resolve().parents[1] / "docs" / "cli.md"
    text = path.read_text()
    head, rest = text.split(REFERENCE_BEGIN)
    tail = rest.split(REFERENCE_END)[1]
    path.write_text(f"{head}{REFERENCE_BEGIN}\n\n{flag_reference()}\n{REFERENCE_END}{tail}")
