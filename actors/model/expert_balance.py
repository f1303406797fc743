"""EPLB on a live rank: count expert load, and every ``eplb_interval_rounds`` re-place the
experts, move their weights and swap every MoE layer's routing table.

When: the runner calls ``end_round`` for every round it executes, before the next one's
forward (so a rebalance whose collective fails, a member lost, runs before any token of the
next round is sampled and the round is simply run again on the re-formed group). Under expert
parallelism every rank of the group executes every round (an idle rank joins with an idle
forward: the MoE collectives demand it), so the count of executed rounds is the same on every
rank and "every ``interval`` rounds" names the same round boundary on all of them, with no
message.

What: the window's per-slot counts are summed over the group (one all-reduce, only here),
turned into logical loads, and placed by DeepSeek's algorithm (``kernels/moe/eplb.py``) —
the same inputs and the same code on every rank give the same placement. Experts a rank
already held keep their slots; the rest arrive over the group's process group
(``expert_moves.apply_moves``). Then the maps are swapped and the window starts again.

Serving goes on: the rebalance runs between two rounds, inside the round that triggers it,
so requests only wait for it; none is dropped or reordered, and since every copy of an
expert holds the same weights, outputs do not change.
"""

from __future__ import annotations

import logging
import socket
import time
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from roundgate.actors.model.expert_moves import apply_moves
from roundgate.kernels.moe.eplb import (
    Layout,
    balancedness,
    move_plan,
    rank_loads,
    replace_layer,
)
from roundgate.kernels.moe.expert_load import ExpertLoad
from roundgate.kernels.moe.expert_map import ExpertMap
from roundgate.kernels.moe.placement import ExpertPlacement
from roundgate.kernels.moe.placement_file import write_loads_file

logger = logging.getLogger("roundgate.eplb")


@dataclass(frozen=True)
class EplbConfig:
    """The ``--enable-eplb`` settings a rank needs."""

    window_rounds: int
    interval_rounds: int
    num_groups: int = 1  # the router's expert groups (hierarchical placement over nodes)
    load_file: str | None = None  # --eplb-load-file: rank 0 writes each window's loads here

    @classmethod
    def of(cls, flags: Any, num_groups: int) -> EplbConfig:
        """The settings from a rank's flags (a ``RunnerConfig``) and its model's router."""
        return cls(
            flags.eplb_window_rounds, flags.eplb_interval_rounds, num_groups, flags.eplb_load_file
        )


@dataclass(frozen=True)
class RebalanceReport:
    """One rebalance, as ``/metrics`` shows it (identical on every rank but the moved rows)."""

    rebalances: int  # this one's ordinal, from 1
    seconds: float  # the whole rebalance on this rank: all-reduce, placement, moves, swap
    experts_moved: int  # slots, group-wide, whose expert came from another rank
    local_copies: int  # slots, group-wide, refilled from the same rank
    # Per MoE layer: mean over max tokens per rank over the window just ended (the old
    # placement, measured) and what the new placement gives the same loads (predicted).
    balancedness: tuple[float, ...]
    predicted: tuple[float, ...]
    window_rounds: int  # rounds the window held (fewer than configured right after a start)


class ExpertBalancer:
    """One rank's EPLB state: the load window, the round count and the rebalance."""

    def __init__(
        self,
        model: Any,  # CausalLM: its ``moe_layers()`` and ``placement``
        config: EplbConfig,
        group: Any = None,
        device: torch.device | str = "cpu",
    ) -> None:
        self.model = model
        self.config = config
        self.group = group
        self.device = device
        self.placement: ExpertPlacement = model.placement
        self.layers = model.moe_layers()
        self.load = ExpertLoad(
            len(self.layers), self.placement.num_physical_experts, config.window_rounds, device
        )
        # Found at the first rebalance (a collective: none at construction, so a rank that
        # joins a re-formed group builds its balancer without its peers).
        self.layout: Layout | None = None
        self.rounds = 0
        self.rebalances = 0
        self.last: RebalanceReport | None = None

    def end_round(self) -> RebalanceReport | None:
        """Close one executed round; at every ``interval_rounds``-th, rebalance (all ranks)."""
        self.load.end_round()
        self.rounds += 1
        if self.rounds % self.config.interval_rounds:
            return None
        return self.rebalance()

    @torch.inference_mode()
    def rebalance(self) -> RebalanceReport:
        """Re-place every MoE layer from the group's summed window; every rank calls it."""
        started = time.perf_counter()
        if self.layout is None:
            nodes = _num_nodes(self.placement, self.group)
            self.layout = self.placement.layout(nodes, self.config.num_groups)
            if not self.layout.hierarchical:  # groups that do not divide over nodes: flat
                self.layout = self.placement.layout()
        counts = self.load.window()
        window_rounds = self.load.rounds
        if self.placement.world_size > 1:
            dist.all_reduce(counts, group=self.group)
        per_slot = counts.tolist()
        measured: list[float] = []
        predicted: list[float] = []
        moved = copied = 0
        place = self.placement
        loads: list[list[float]] = []
        for layer, slot_loads in zip(self.layers, per_slot, strict=True):
            old = layer.expert_map.physical_to_logical
            measured.append(balancedness(_per_rank(slot_loads, place)))
            logical = [0.0] * place.num_experts
            for slot, tokens in enumerate(slot_loads):
                logical[old[slot]] += tokens
            loads.append(logical)
            new = replace_layer(old, logical, self.layout)
            predicted.append(balancedness(rank_loads(new, logical, place.world_size)))
            if new == old:
                continue
            moves = move_plan(old, new, place.world_size)
            moved += sum(m.src_rank != m.dst_rank for m in moves)
            copied += sum(m.src_rank == m.dst_rank for m in moves)
            apply_moves([layer.w13, layer.w2], moves, place.rank, place.world_size, self.group)
            layer.expert_map = ExpertMap(place, new, layer.expert_map.table.device)
        self.load.reset()
        self.rebalances += 1
        if self.config.load_file and place.rank == 0:
            try:
                write_loads_file(self.config.load_file, window_rounds, loads)
            except OSError as exc:  # a full disk must not stop serving
                logger.warning("--eplb-load-file %s: %s", self.config.load_file, exc)
        report = RebalanceReport(
            self.rebalances,
            time.perf_counter() - started,
            moved,
            copied,
            tuple(measured),
            tuple(predicted),
            window_rounds,
        )
        self.last = report
        logger.info(
            "EPLB rebalance %d: %d experts moved between ranks, %d copied within, %.3f s; "
            "balancedness min %.3f -> predicted %.3f",
            report.rebalances,
            moved,
            copied,
            report.seconds,
            min(measured, default=1.0),
            min(predicted, default=1.0),
        )
        return report


def _per_rank(slot_loads: list[float], place: ExpertPlacement) -> list[float]:
    n = place.num_local_experts
    return [sum(slot_loads[r * n : (r + 1) * n]) for r in range(place.world_size)]


def _num_nodes(place: ExpertPlacement, group: Any) -> int:
    """Nodes the group spans, when its ranks sit in equal contiguous runs per host (the
    hierarchical placement's assumption); else 1 (flat placement)."""
    if place.world_size == 1 or not dist.is_initialized():
        return 1
    hosts: list[Any] = [None] * place.world_size
    dist.all_gather_object(hosts, socket.gethostname(), group=group)
    runs = [hosts[0]]
    for host in hosts[1:]:
        if host != runs[-1]:
            runs.append(host)
    if len(set(runs)) != len(runs) or place.world_size % len(runs):
        return 1
    size = place.world_size // len(runs)
    if any(hosts[i * size : (i + 1) * size] != [h] * size for i, h in enumerate(runs)):
        return 1
    return len(runs)
