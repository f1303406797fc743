"""Re-homing experts when a MoE group's membership changes (elastic expert parallelism).

A group that loses a rank loses the expert copies that rank held; a group that admits a rank
gains empty slots. Before the new epoch serves, every logical expert needs a copy on a member.
Every member gathers what each member holds (the logical expert in each of its slots, per MoE
layer; a joiner holds what it loaded, or nothing) and runs this same pure plan, so all of them
agree without another message:

1. the new placement, moving as little as it can: every member keeps what it holds in the
   slots it holds it in; each expert no member holds goes to the least loaded member with a
   free slot; the spare slots (a joiner's, a grown survivor's) take copies of the experts with
   the most load per copy. Balancing the measured load is the next EPLB rebalance's job, on
   the re-formed group;
2. per slot of the new placement, where its weights come from: the member's own old slot (a
   local copy), else another member that holds the expert (a transfer over the new group),
   else the model's files (a load: only when no member holds a copy, which redundant experts
   avoid).

Pure arithmetic, no torch: tables test it, and ``actors/model/expert_rehome.py`` carries it out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from roundgate.kernels.moe.eplb import Layout, Move, Placement


@dataclass(frozen=True)
class DiskLoad:
    """A slot filled from the model's files: no member holds a copy of its expert."""

    expert: int
    rank: int
    slot: int


@dataclass(frozen=True)
class RehomePlan:
    """One layer's new placement and how each of its slots is filled."""

    placement: Placement
    moves: tuple[Move, ...]  # src_slot: the source member's old slot; dst: the new placement
    loads: tuple[DiskLoad, ...]

    @property
    def transfers(self) -> int:
        """Slots whose weights cross to another member."""
        return sum(m.src_rank != m.dst_rank for m in self.moves)


def rehome_layer(
    held: Sequence[Sequence[int]], layout: Layout, loads: Sequence[float] | None = None
) -> RehomePlan:
    """The plan for one layer: ``held[r]`` is the logical expert in each old slot of the new
    group's member ``r`` (empty for a member that holds none); ``loads`` per logical expert
    (uniform when None or all zero) decides which experts get the spare slots."""
    if len(held) != layout.num_ranks:
        raise ValueError(f"holdings of {len(held)} members for a group of {layout.num_ranks}")
    weights = list(loads) if loads is not None and any(loads) else [1.0] * layout.num_logical
    slots = _keep_and_fill(held, layout, weights)
    placement = tuple(e for member in slots for e in member)
    holders: dict[int, list[tuple[int, int]]] = {}
    for member, experts in enumerate(held):
        for slot, expert in enumerate(experts):
            holders.setdefault(expert, []).append((member, slot))
    sends = [0] * layout.num_ranks
    moves: list[Move] = []
    disk: list[DiskLoad] = []
    n = layout.slots_per_rank
    for index, expert in enumerate(placement):
        dst, dst_slot = divmod(index, n)
        sources = holders.get(expert, [])
        if not sources:
            disk.append(DiskLoad(expert, dst, dst_slot))
            continue
        local = [s for s in sources if s[0] == dst]
        kept = (dst, dst_slot) if (dst, dst_slot) in local else None
        src, src_slot = kept or (
            local[0] if local else min(sources, key=lambda s: (sends[s[0]], s))
        )
        if src != dst:
            sends[src] += 1
        moves.append(Move(expert, src, src_slot, dst, dst_slot))
    return RehomePlan(placement, tuple(moves), tuple(disk))


def _keep_and_fill(
    held: Sequence[Sequence[int]], layout: Layout, weights: Sequence[float]
) -> list[list[int]]:
    """Each member's new slots: what it holds stays where it is (moving nothing); an expert
    no slot keeps goes to the member that holds it in a dropped slot, else to the least
    loaded member with room; spare slots take copies of the experts with the most load per
    copy (preferring one the member lacks). A group that shrank its slots below what its
    members keep evicts surplus copies, the least loaded per copy first."""
    n, num_logical = layout.slots_per_rank, layout.num_logical
    slots: list[list[int | None]] = [
        [experts[i] if i < len(experts) else None for i in range(n)] for experts in held
    ]
    copies = [0] * num_logical
    for member in slots:
        for expert in member:
            if expert is not None:
                copies[expert] += 1

    def load(member: list[int | None]) -> float:
        return sum(weights[e] / copies[e] for e in member if e is not None)

    def put(expert: int, candidates: list[int]) -> None:
        free = [m for m in candidates if None in slots[m]]
        if not free:  # every slot kept: evict a surplus copy (its expert has another)
            victims = [
                (weights[e] / copies[e], m, i)
                for m in candidates
                for i, e in enumerate(slots[m])
                if e is not None and copies[e] > 1
            ]
            _, m, i = min(victims)
            copies[slots[m][i]] -= 1  # type: ignore[index]
            slots[m][i] = None
            free = [m]
        member = min(free, key=lambda m: (load(slots[m]), m))
        slots[member][slots[member].index(None)] = expert
        copies[expert] += 1

    everyone = list(range(len(slots)))
    for expert in sorted(range(num_logical), key=lambda e: (-weights[e], e)):
        if copies[expert]:
            continue
        dropped = [m for m, experts in enumerate(held) if expert in experts]
        put(expert, dropped if any(None in slots[m] for m in dropped) else everyone)
    for member in everyone:
        while None in slots[member]:
            lacking = [e for e in range(num_logical) if e not in slots[member]]
            pool = lacking or list(range(num_logical))
            expert = max(pool, key=lambda e: (weights[e] / (copies[e] + 1), -e))
            slots[member][slots[member].index(None)] = expert
            copies[expert] += 1
    return [[e for e in member if e is not None] for member in slots]


def grown_layout(num_logical: int, slots_per_rank: int, num_ranks: int) -> Layout:
    """The layout of a re-formed group of ``num_ranks``: each member has the configured
    ``slots_per_rank`` where the group's slots still hold every logical expert, else every
    member grows to the fewest slots that do (a lone survivor of two holds every expert).
    Redundant slots are what is left over; at full size it is the configured layout."""
    per_rank = max(slots_per_rank, -(-num_logical // num_ranks))
    return Layout(num_logical, per_rank * num_ranks, num_ranks)
