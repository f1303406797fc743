"""What a prefill policy declares about itself, so nothing else needs a branch per policy.

A policy module defines a frozen config dataclass (its flags: defaults, help, and validation in
``__post_init__`` that names the flag), the policy class (``roundgate.gate.policy.PrefillPolicy``:
its ``extra_columns`` name the gather columns it reads; ``RoundByRound`` gives the quiet-round
answers of a policy without a closed form for them) and one ``PolicySpec`` tying them to the
policy's name. The registry
(``roundgate.gate.registry``) derives the CLI flags, the ``ServerArgs`` / serve-config keys and the
``--prefill-policy`` choices from these declarations.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from roundgate.gate.policy import PrefillPolicy


@dataclass(frozen=True, slots=True)
class PolicyContext:
    """What a policy may know about its rank beyond its own flags."""

    rank: int
    dp_size: int
    max_batch_size: int  # running requests one rank may hold (``max_num_seqs // dp_size``)


@dataclass(frozen=True, slots=True)
class Flag:
    """One flag of a policy: ``--name-with-dashes`` on the CLI, ``name`` in ServerArgs/serve."""

    name: str
    field: str  # the config dataclass field it fills
    kind: type  # int, float, bool or str
    default: Any  # REQUIRED when the policy cannot run without it
    help: str
    sim_default: Any  # what ``roundgate simulate`` uses when the flag is not given

    @property
    def cli(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def required(self) -> bool:
        return self.default is REQUIRED


REQUIRED: Any = dataclasses.MISSING


@dataclass(frozen=True)
class PolicySpec:
    """A policy's name, flags (from ``config``'s fields) and constructor; its gather columns
    are the ``extra_columns`` of the class ``build`` returns."""

    name: str
    summary: str
    config: type  # frozen dataclass; field metadata: "help", optional "flag", "sim_default"
    build: Callable[[Any, PolicyContext], PrefillPolicy]
    flag_prefix: str = ""  # prepended to field names that have no explicit "flag"

    @functools.cached_property
    def flags(self) -> tuple[Flag, ...]:
        flags = []
        for f in dataclasses.fields(self.config):
            meta = f.metadata
            default = f.default
            flags.append(
                Flag(
                    name=meta.get("flag", self.flag_prefix + f.name),
                    field=f.name,
                    kind=annotation_type(f.type),
                    default=default,
                    help=meta.get("help", ""),
                    sim_default=meta.get("sim_default", None if default is REQUIRED else default),
                )
            )
        return tuple(flags)

    def make_config(self, given: Mapping[str, Any]) -> Any:
        """The config from the flags given (by flag name); errors name the flag."""
        values = {}
        for flag in self.flags:
            if flag.name not in given:
                if flag.required:
                    raise ValueError(f"--prefill-policy {self.name} needs {flag.cli}")
                continue
            values[flag.field] = check_type(flag, given[flag.name])
        return self.config(**values)


def check_type(flag: Flag, value: Any) -> Any:
    """``value`` if it has the flag's type (an int passes for a float); else a named error."""
    ok = isinstance(value, flag.kind) and not (flag.kind is not bool and isinstance(value, bool))
    if flag.kind is float and isinstance(value, int) and not isinstance(value, bool):
        ok = True
    if value is not None and not ok:
        article = "an" if flag.kind is int else "a"
        raise ValueError(f"{flag.cli} must be {article} {_NAMES[flag.kind]}, got {value!r}")
    return value


_NAMES = {int: "integer", float: "number", bool: "boolean", str: "string"}


def annotation_type(annotation: Any) -> type:
    """The scalar type a (string) field annotation names: bool, int, float, else str."""
    text = str(annotation)
    for name, kind in (("bool", bool), ("int", int), ("float", float)):
        if name in text:
            return kind
    return str
