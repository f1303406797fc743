"""``roundgate eplb-plan``: a static expert placement from recorded expert loads.

The offline half of EPLB (SGLang's ``--init-expert-location`` from a recorded distribution,
DeepSeek's EPLB run on a load log): a loads file (``--eplb-load-file`` of a running group, or
any ``{"layers": [[tokens per logical expert], ...]}``) is placed for a group of ``--dp-size``
ranks with ``--num-redundant-experts`` extra slots, by the same algorithm a live rebalance
runs, and written as an ``--expert-placement-file``. Prints each layer's balancedness under
the contiguous blocks and under the new placement, for those loads.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from roundgate.kernels.moe.eplb import Layout, balancedness, place_layer, rank_loads
from roundgate.kernels.moe.placement import ExpertPlacement
from roundgate.kernels.moe.placement_file import read_loads_file, write_placement_file


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "eplb-plan",
        help="an --expert-placement-file from recorded expert loads (--eplb-load-file)",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("loads", type=Path, help="the loads file (JSON: 'layers', per MoE layer)")
    p.add_argument("--out", "-o", type=Path, required=True, help="the placement file to write")
    p.add_argument("--dp-size", type=int, required=True, help="ranks the experts spread over")
    p.add_argument("--num-redundant-experts", type=int, default=0, help="extra slots per layer")
    p.add_argument(
        "--num-nodes",
        type=int,
        default=1,
        help="nodes the ranks span (DeepSeek's hierarchical placement when --num-groups "
        "divides over them)",
    )
    p.add_argument("--num-groups", type=int, default=1, help="the router's expert groups")
    p.set_defaults(func=run, parser=p)


def plan(
    loads: list[list[float]], dp_size: int, redundant: int, num_nodes: int, num_groups: int
) -> tuple[Layout, list[tuple[float, float]]]:
    """The layout the loads are placed on, and each layer's (blocks, placed) balancedness."""
    num_experts = len(loads[0])
    placement = ExpertPlacement(num_experts, dp_size, 0, redundant)
    layout = placement.layout(num_nodes, num_groups)
    if not layout.hierarchical:  # groups that do not divide over the nodes: flat
        layout = placement.layout()
    blocks = [e * dp_size // num_experts for e in range(num_experts)]
    rows = []
    for layer in loads:
        per_rank = [0.0] * dp_size
        for expert, tokens in enumerate(layer):
            per_rank[blocks[expert]] += tokens
        placed = rank_loads(place_layer(layer, layout), layer, dp_size)
        rows.append((balancedness(per_rank), balancedness(placed)))
    return layout, rows


def run(ns: argparse.Namespace) -> int:
    try:
        loads = read_loads_file(ns.loads)
        minimums = (
            ("--dp-size", ns.dp_size, 1),
            ("--num-nodes", ns.num_nodes, 1),
            ("--num-groups", ns.num_groups, 1),
            ("--num-redundant-experts", ns.num_redundant_experts, 0),
        )
        for flag, value, least in minimums:
            if value < least:
                raise ValueError(f"{flag} must be >= {least}, got {value}")
        if ns.dp_size % ns.num_nodes:
            raise ValueError(f"--num-nodes {ns.num_nodes} does not divide --dp-size {ns.dp_size}")
        if len(loads[0]) % ns.num_groups:
            raise ValueError(
                f"--num-groups {ns.num_groups} does not divide the {len(loads[0])} experts"
            )
        layout, rows = plan(
            loads, ns.dp_size, ns.num_redundant_experts, ns.num_nodes, ns.num_groups
        )
    except ValueError as exc:
        ns.parser.error(str(exc))
    write_placement_file(ns.out, layout, loads)
    print("| MoE layer | balancedness, blocks | balancedness, placed |")
    print("| --- | --- | --- |")
    for index, (before, after) in enumerate(rows):
        print(f"| {index} | {before:.3f} | {after:.3f} |")
    print(f"wrote {ns.out}")
    return 0
