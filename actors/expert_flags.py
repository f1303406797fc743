"""The expert-parallel load balancing flags, checked against the model and the group.

Refused up front, with the flag named, wherever they cannot apply: a dense model, one rank
(nothing to balance over), slot counts that do not divide over the ranks, a placement file
that does not fit. Checked once when ``ServerArgs`` is built, so a bad combination fails the
deploy, not every rank's start.
"""

from __future__ import annotations

from typing import Protocol

from roundgate.actors.model.config import ModelConfig
from roundgate.kernels.moe.placement import ExpertPlacement
from roundgate.kernels.moe.placement_file import read_placement_file


class ExpertFlags(Protocol):
    """What the check reads of ``ServerArgs`` (a protocol: ``server_args`` imports this
    module, so this one names no type of its)."""

    model: str
    model_config: ModelConfig
    dp_size: int
    enable_eplb: bool
    num_redundant_experts: int
    eplb_window_rounds: int
    eplb_interval_rounds: int
    expert_placement_file: str | None
    eplb_load_file: str | None


def check_expert_flags(args: ExpertFlags) -> None:
    """Raise ``ValueError`` naming the flag for an EPLB setting that cannot apply."""
    given = [
        flag
        for flag, on in (
            ("--enable-eplb", args.enable_eplb),
            ("--num-redundant-experts", args.num_redundant_experts != 0),
            ("--expert-placement-file", args.expert_placement_file is not None),
            ("--eplb-load-file", args.eplb_load_file is not None),
        )
        if on
    ]
    if args.eplb_window_rounds > args.eplb_interval_rounds:
        raise ValueError(
            f"--eplb-window-rounds ({args.eplb_window_rounds}) must be <= "
            f"--eplb-interval-rounds ({args.eplb_interval_rounds}): a window spans one "
            "placement"
        )
    redundant = args.num_redundant_experts
    if isinstance(redundant, bool) or not isinstance(redundant, int) or redundant < 0:
        raise ValueError(f"--num-redundant-experts must be an integer >= 0, got {redundant!r}")
    if not given:
        return
    config = args.model_config
    if not config.is_moe:
        raise ValueError(f"{given[0]} applies to MoE models; {args.model} is dense")
    if args.dp_size < 2:
        raise ValueError(
            f"{given[0]} balances experts over the ranks of an expert-parallel group: it needs "
            f"--dp-size > 1 (got {args.dp_size})"
        )
    if redundant and not (args.enable_eplb or args.expert_placement_file):
        raise ValueError(
            "--num-redundant-experts needs --enable-eplb or --expert-placement-file (a "
            "placement that uses the extra slots)"
        )
    if args.eplb_load_file is not None and not args.enable_eplb:
        raise ValueError("--eplb-load-file is written at EPLB rebalances: it needs --enable-eplb")
    placement = ExpertPlacement(config.num_experts, args.dp_size, 0, redundant)
    if args.expert_placement_file is not None:
        moe_layers = sum(config.is_moe_layer(i) for i in range(config.num_layers))
        read_placement_file(args.expert_placement_file, placement.layout(), moe_layers)
