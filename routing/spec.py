"""What a router declares about itself, so nothing else needs a branch per router.

A router module defines one ``RouterEntry``: its name, a line of help, the settings it reads
(``Option``: name, type, default, help and bound, each declared once and shared by the routers
that read it), where it runs (a Serve request router class, the simulator, or both) and the
arguments its policy is built with. The registry (``roundgate.routing.registry``) derives the serve
config's router keys, ``roundgate simulate``'s router flags and every ``--router`` choice from
these declarations, and checks a configuration against them with errors that name the culprit
as its user wrote it (a serve-config key, or a ``--flag``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from roundgate.actors.server_args import ServerArgs

# How a setting is named in an error: ``key`` for the serve config, ``flag`` for the CLI.
Spell = Callable[[str], str]


def key(name: str) -> str:
    """A serve-config key: the name itself."""
    return name


def flag(name: str) -> str:
    """A command-line flag: ``--name-with-dashes``."""
    return "--" + name.replace("_", "-")


@dataclass(frozen=True)
class Option:
    """One router setting: ``name`` in the serve config, ``--name-with-dashes`` on the CLI.

    ``kind`` is int, float, bool, or ``tuple`` for a list of integers (``8,1,1,1`` on the
    command line). A value equal to ``default`` counts as not given: only a given value is
    refused for a router that does not read it.
    """

    name: str
    kind: type
    default: Any
    help: str
    minimum: float | None = None  # refused below it (and NaN), naming the setting

    @property
    def cli(self) -> str:
        return flag(self.name)

    def is_given(self, value: Any) -> bool:
        return value is not None and value != self.default

    def check(self, value: Any, spell: Spell) -> None:
        """Refuse ``value`` below the bound, naming the setting as ``spell`` writes it."""
        if value is None or self.minimum is None or self.kind is tuple:
            return
        if not value >= self.minimum:  # also refuses NaN
            raise ValueError(f"{spell(self.name)} must be >= {self.minimum}, got {value}")

    def parse(self, text: str | None) -> Any:
        """A list setting from the command line (``8,1,1,1``); others come typed."""
        if text is None or self.kind is not tuple:
            return text
        try:
            return tuple(int(w) for w in text.split(","))
        except ValueError:
            raise ValueError(f"{self.cli}: expected integers like 8,1,1,1, got {text!r}") from None


def _no_arguments(values: Mapping[str, Any], engine: ServerArgs) -> dict[str, Any]:
    return {}


def _no_check(values: Mapping[str, Any], dp_size: int, spell: Spell) -> None:
    return None


@dataclass(frozen=True)
class RouterEntry:
    """A router's name, help, settings and where it runs."""

    name: str
    summary: str
    options: tuple[Option, ...] = ()  # the settings it reads
    # The Ray Serve request router (``module:Class``) that runs it; None: simulated only.
    serve_class: str | None = None
    # A ``router:`` choice of the serve config (decode-load is not: P/D's kv-aware picks it).
    serve: bool = True
    simulate: bool = True  # a ``--router`` choice of ``roundgate simulate``
    reads_kv_events: bool = False  # its index is fed by the ranks' KV events (the hub)
    # The prefill policies it needs the ranks to run (empty: any).
    needs_prefill_policy: tuple[str, ...] = ()
    # Its policy's arguments (Serve's ``request_router_kwargs``; the simulator builds the same
    # config from them) for ranks running ``engine``, from every setting's value by name.
    arguments: Callable[[Mapping[str, Any], ServerArgs], dict[str, Any]] = _no_arguments
    # What its settings must satisfy beyond their bounds (``values`` by name, every one).
    check: Callable[[Mapping[str, Any], int, Spell], None] = _no_check
    # As a P/D deployment's ``router``: the Serve router of (the prefill role, the decode
    # role); None: not a P/D choice.
    pd_roles: tuple[str, str] | None = None

    def __post_init__(self) -> None:
        if self.serve and self.serve_class is None:
            raise ValueError(f"router {self.name!r}: a serve choice needs a serve_class")

    def own(self, values: Mapping[str, Any]) -> dict[str, Any]:
        """The values of the settings this router reads (defaults where not given)."""
        own = {}
        for option in self.options:
            value = values.get(option.name)
            own[option.name] = option.default if value is None else value
        return own
