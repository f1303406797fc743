"""``roundgate simulate``'s expert-load flags -> an ``ExpertSpec`` (or None: mean-load pricing).

Kept beside ``roundgate.sim.options`` rather than in it: the flags only mean something for a
MoE cost preset, and every rule about them (which preset, which placement, which values) sits
here. Unset flags are None, so a flag given where it cannot apply is refused by name instead
of silently ignored.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping
from dataclasses import fields
from pathlib import Path
from typing import Any

from roundgate.sim.expert_parallel import (
    MOE_PRESETS,
    PLACEMENTS,
    ExpertSpec,
    ExpertStats,
    MoeShape,
)

# Flag (by its ``argparse`` dest) -> ``ExpertSpec`` field, type and help.
EXPERT_FLAGS: dict[str, tuple[str, type, str]] = {
    "num_redundant_experts": (
        "num_redundant_experts",
        int,
        "eplb: extra expert slots for copies of hot experts ((experts + this) must divide "
        "over --dp-size)",
    ),
    "eplb_interval_rounds": ("interval_rounds", int, "eplb: busy rounds between rebalances"),
    "eplb_window_rounds": (
        "window_rounds",
        int,
        "eplb: busy rounds of expert load a rebalance reads (<= --eplb-interval-rounds)",
    ),
    "eplb_rebalance_ms": (
        "rebalance_ms",
        float,
        "eplb: the group's pause for one rebalance's weight moves",
    ),
    "expert_skew": (
        "skew",
        float,
        "standard deviation of log expert popularity (0: uniform, every rank at the mean)",
    ),
    "expert_drift": (
        "drift",
        float,
        "per busy round, the random-walk step of log popularity (<= --expert-skew)",
    ),
    "expert_seed": ("seed", int, "seed of the expert popularity"),
    "expert_compute_share": (
        "compute_share",
        float,
        "share of a rank's forward in the routed experts, stretched by max/mean rank load",
    ),
    "expert_layers": ("num_layers", int, "MoE layers simulated, each with its own popularity"),
}
_DEFAULTS = {f.name: f.default for f in fields(ExpertSpec)}


def add_expert_args(p: argparse.ArgumentParser) -> None:
    """The expert-load flags, all unset by default (``--expert-placement none``)."""
    g = p.add_argument_group(
        f"MoE expert load (--costs {', '.join(MOE_PRESETS)}; docs/expert-parallel.md)"
    )
    g.add_argument(
        "--expert-placement",
        default=None,
        choices=PLACEMENTS,
        help="none: every rank at the mean expert load (the preset's price); static: "
        "contiguous blocks under a skewed, drifting popularity; eplb: re-placed from measured "
        "load every --eplb-interval-rounds (default: none)",
    )
    for dest, (name, kind, text) in EXPERT_FLAGS.items():
        g.add_argument(
            "--" + dest.replace("_", "-"),
            type=kind,
            default=None,
            help=f"{text} (default: {_DEFAULTS[name]})",
        )


def moe_shape(costs: str) -> MoeShape | None:
    """The MoE model a ``--costs`` value prices: a MoE preset, or a JSON file whose ``base``
    is one; None for a dense one (or an unreadable file, refused by ``--costs`` itself)."""
    if costs.endswith(".json"):
        try:
            base = json.loads(Path(costs).read_text()).get("base", "toy")
        except (OSError, ValueError, AttributeError):
            return None
        return MOE_PRESETS.get(base) if isinstance(base, str) else None
    return MOE_PRESETS.get(costs)


def expert_spec(given: Mapping[str, Any], costs: str, dp_size: int) -> ExpertSpec | None:
    """The run's ``ExpertSpec`` from the parsed flags (by dest; missing or None: not given);
    None for ``--expert-placement none``. Refusals name the flag."""
    placement = given.get("expert_placement") or "none"
    named = [dest for dest in EXPERT_FLAGS if given.get(dest) is not None]
    if placement == "none":
        if named:
            flag = "--" + named[0].replace("_", "-")
            raise ValueError(f"{flag} needs --expert-placement static or eplb")
        return None
    if placement not in PLACEMENTS:
        raise ValueError(
            f"--expert-placement must be one of {', '.join(PLACEMENTS)}, got {placement!r}"
        )
    shape = moe_shape(costs)
    if shape is None:
        raise ValueError(
            f"--expert-placement applies to a MoE cost preset ({', '.join(MOE_PRESETS)}, or a "
            f"JSON file based on one); --costs {costs} is not one"
        )
    eplb_only = [d for d in named if d.startswith("eplb_") or d == "num_redundant_experts"]
    if placement == "static" and eplb_only:
        flag = "--" + eplb_only[0].replace("_", "-")
        raise ValueError(f"{flag} needs --expert-placement eplb")
    values = {EXPERT_FLAGS[dest][0]: given[dest] for dest in named}
    return ExpertSpec(placement, dp_size, shape, **values)


def refuse_expert_flags(given: Mapping[str, Any], mode: str) -> None:
    """Refuse, by flag, an expert-load flag given to a run that does not price it (``mode``:
    the flag that chose that run, e.g. ``--scenario``)."""
    for dest in ("expert_placement", *EXPERT_FLAGS):
        if given.get(dest) is not None:
            flag = "--" + dest.replace("_", "-")
            raise ValueError(f"{flag} prices a fused group's rounds; {mode} runs do not read it")


def describe_experts(policy: str, stats: ExpertStats) -> str:
    """One line for the run's table: what the placement achieved."""
    redundant = f" + {stats.num_redundant_experts} redundant" if stats.num_redundant_experts else ""
    return (
        f"experts ({policy}): {stats.placement}{redundant}, mean balancedness "
        f"{stats.mean_balancedness:.3f}, expert time x{stats.mean_factor:.3f} of the mean "
        f"load, {stats.rebalances} rebalances over {stats.rounds} busy rounds"
    )
