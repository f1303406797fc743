"""The prefill policies by name: one line per built-in policy module, plus ``register``.

Everything that lists policies or their flags (``ServerArgs``, the serve config, the CLIs, the
simulator) asks this module, so adding a policy is its own file plus one line here.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

from roundgate.gate.policy import PrefillPolicy
from roundgate.gate.spec import Flag, PolicyContext, PolicySpec

# Each module defines ``POLICY: PolicySpec``. Imported by name (not at the top) so the policy
# modules may import the gate's shared parts without a cycle through this file.
BUILTIN_MODULES = (
    "roundgate.gate.group_gate",
    "roundgate.gate.auto",
    "roundgate.gate.no_gate",
    "roundgate.gate.local_interval",
    "roundgate.gate.sglang_delayer",
    "roundgate.gate.vllm_interval",
    "roundgate.gate.trtllm_balance",
    "roundgate.gate.vllm_alignment",
    "roundgate.gate.atom_coalescer",
    "roundgate.gate.tpu_dp_hold",
)

_SPECS: dict[str, PolicySpec] = {}
# Every flag by name with its owner, derived from _SPECS; rebuilt when a policy is added or
# removed (ServerArgs consults it for each keyword it is built with).
_FLAGS: dict[str, tuple[Flag, str]] = {}


def _load() -> dict[str, PolicySpec]:
    if not _SPECS:
        for module in BUILTIN_MODULES:
            spec = importlib.import_module(module).POLICY
            _SPECS[spec.name] = spec
    return _SPECS


def register(spec: PolicySpec) -> None:
    """Add a policy (e.g. from a plugin or a test); its flags must not clash with others'."""
    specs = _load()
    taken = {flag.name: other.name for other in specs.values() for flag in other.flags}
    for flag in spec.flags:
        owner = taken.get(flag.name)
        if owner is not None and owner != spec.name:
            raise ValueError(f"policy {spec.name!r}: flag {flag.cli} already belongs to {owner!r}")
    specs[spec.name] = spec
    _FLAGS.clear()


def unregister(name: str) -> None:
    _load().pop(name, None)
    _FLAGS.clear()


def names() -> tuple[str, ...]:
    """The ``--prefill-policy`` choices, built-ins first."""
    return tuple(_load())


def get(name: str) -> PolicySpec:
    specs = _load()
    if name not in specs:
        raise ValueError(f"--prefill-policy must be one of {', '.join(specs)}, got {name!r}")
    return specs[name]


def all_flags() -> dict[str, tuple[Flag, str]]:
    """Every policy flag by name, with the policy that owns it."""
    if not _FLAGS:
        _FLAGS.update(
            (flag.name, (flag, spec.name)) for spec in _load().values() for flag in spec.flags
        )
    return _FLAGS


def comparison_flags(name: str, given: Mapping[str, Any]) -> dict[str, Any]:
    """The named policy's flags for a comparison run (``roundgate simulate``/``bench``): each
    as given (by flag name; None counts as not given), else the flag's simulate default."""
    values = {}
    for flag in get(name).flags:
        value = given.get(flag.name)
        values[flag.name] = flag.sim_default if value is None else value
    return values


def implied_policy(given: Mapping[str, Any]) -> str:
    """The policy a config names without ``--prefill-policy``: the one whose required flags
    are given (the gate's intervals, or the local interval), else ``none``."""
    for spec in _load().values():
        required = [flag for flag in spec.flags if flag.required]
        if required and any(flag.name in given for flag in required):
            return spec.name
    return "none"


def build(name: str, given: Mapping[str, Any], ctx: PolicyContext) -> PrefillPolicy:
    """The named policy for one rank, from the flags given (by flag name)."""
    spec = get(name)
    return spec.build(spec.make_config(given), ctx)
