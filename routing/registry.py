"""The routers by name: one line per router module, and what is derived from them.

Everything that lists routers or their settings (the serve config's keys and ``router:``
choices, the Serve request router classes, ``roundgate simulate``'s flags and ``--router``
choices, ``roundgate bench --deploy-router``) asks this module, so adding a router is its own
module (defining ``ROUTER: RouterEntry``) plus one line here.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal

from roundgate.routing.spec import Option, RouterEntry, Spell

if TYPE_CHECKING:
    from roundgate.actors.server_args import ServerArgs

# Each module defines ``ROUTER: RouterEntry``; in the order the choices are listed.
BUILTIN_MODULES = (
    "roundgate.routing.round_robin",
    "roundgate.routing.least_loaded",
    "roundgate.routing.skewed",
    "roundgate.routing.vllm_lb",
    "roundgate.routing.cache_aware",
    "roundgate.routing.kv_router",
    "roundgate.routing.gate_aware",
    "roundgate.routing.oracle",
    "roundgate.routing.decode_load",
)
DEFAULT = "round-robin"
PD_DEFAULT = "cache-aware"  # a P/D deployment's router when none is given

Surface = Literal["serve", "simulate"]
_ENTRIES: dict[str, RouterEntry] = {}


def _load() -> dict[str, RouterEntry]:
    if not _ENTRIES:
        for module in BUILTIN_MODULES:
            entry = importlib.import_module(module).ROUTER
            _ENTRIES[entry.name] = entry
    return _ENTRIES


def entries() -> tuple[RouterEntry, ...]:
    return tuple(_load().values())


def names(surface: Surface) -> tuple[str, ...]:
    """The ``router:`` choices of the serve config, or ``--router``'s of the simulator."""
    return tuple(e.name for e in entries() if getattr(e, surface))


def get(name: str, surface: Surface, spell: Spell) -> RouterEntry:
    """The router ``name`` as a choice of ``surface``; else an error naming the setting."""
    choices = names(surface)
    if name not in choices:
        raise ValueError(f"{spell('router')} must be one of {', '.join(choices)}, got {name!r}")
    return _load()[name]


def entry(name: str) -> RouterEntry:
    """Any registered router (P/D's decode-load included), by name."""
    return _load()[name]


def serve_classes() -> dict[str, str]:
    """Every router Serve runs -> its request router class (``module:Class``)."""
    return {e.name: e.serve_class for e in entries() if e.serve_class is not None}


def options(surface: Surface) -> tuple[Option, ...]:
    """The settings of the routers of ``surface``, each once, in the routers' order."""
    found: dict[str, Option] = {}
    for e in entries():
        if getattr(e, surface) or (surface == "serve" and e.serve_class is not None):
            for option in e.options:
                found.setdefault(option.name, option)
    return tuple(found.values())


def readers(name: str, surface: Surface) -> tuple[str, ...]:
    """The routers of ``surface`` that read the setting ``name``."""
    return tuple(n for n in names(surface) if any(o.name == name for o in entry(n).options))


def kv_event_routers(surface: Surface) -> tuple[str, ...]:
    """The routers of ``surface`` that read the ranks' KV events."""
    return tuple(e.name for e in entries() if getattr(e, surface) and e.reads_kv_events)


def check(
    routers: Sequence[str],
    values: Mapping[str, Any],
    dp_size: int,
    surface: Surface,
    spell: Spell,
) -> None:
    """``values`` (settings by name; missing or None: not given) for a group of ``dp_size``
    ranks routed by ``routers`` (P/D: one per role): each within its bound, none given that
    no router reads, and each router's own check. Errors name the setting as ``spell`` writes
    it (the serve config's key, or ``surface``'s flag)."""
    known = {o.name: o for e in entries() for o in e.options}
    for name, value in values.items():
        option = known.get(name)
        if option is None:
            continue
        option.check(value, spell)
        if option.is_given(value) and not any(option in entry(r).options for r in routers):
            reading = " or ".join(readers(name, surface))
            raise ValueError(
                f"{spell(name)} applies to {spell('router')} {reading} only, "
                f"not {' or '.join(dict.fromkeys(routers))}"
            )
    for router in routers:
        entry(router).check(values, dp_size, spell)


def check_prefill_policy(name: str, policy: str, spell: Spell) -> None:
    """A router that reads the gate refuses ranks that run no gate."""
    needed = entry(name).needs_prefill_policy
    if needed and policy not in needed:
        raise ValueError(
            f"{spell('router')} {name} needs {spell('prefill_policy')} {' or '.join(needed)}"
            f", got {policy!r}"
        )


def check_pd(name: str, spell: Spell) -> None:
    """A router that reads the gate cannot route P/D: neither role runs a prefill gate."""
    if name in _load() and entry(name).needs_prefill_policy:
        raise ValueError(
            f"{spell('router')} {name}: a P/D deployment runs no prefill gate (the prefill role "
            f"only prefills, the decode role only decodes); use {spell('router')} kv-aware"
        )


def pd_role_routers(name: str | None, spell: Spell) -> dict[str, str]:
    """Each role's Serve router for a P/D deployment's ``router`` (None: the default); a
    router that declares no P/D roles is refused naming it."""
    name = PD_DEFAULT if name is None else name
    check_pd(name, spell)
    pd = {e.name: e.pd_roles for e in entries() if e.pd_roles is not None}
    if name not in pd:
        raise ValueError(
            f"{spell('router')} {name!r}: a P/D deployment routes with {' or '.join(pd)} (the "
            "prefill rank by uncached prompt tokens, the decode rank by decode load)"
        )
    prefill, decode = pd[name]
    return {"prefill": prefill, "decode": decode}


def arguments(name: str, values: Mapping[str, Any], engine: ServerArgs) -> dict[str, Any]:
    """Router ``name``'s policy arguments for ranks running ``engine``."""
    return entry(name).arguments(values, engine)
