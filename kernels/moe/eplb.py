"""Expert-parallel load balancing (EPLB): where each logical expert's physical copies go.

Pure arithmetic on loads (no torch), so every rank of a group computes the same placement
from the same summed loads, the simulator prices it, and tests check it as tables.

Terms, as vLLM and SGLang use them: a *logical* expert is the model's; a *physical* expert is
one copy of it in one slot of one rank; rank ``r`` holds slots ``[r * n, (r + 1) * n)``
(``n = num_physical // num_ranks``), the contiguous numbering DeepEP assumes. A placement of
one MoE layer is ``physical_to_logical``: the logical expert in every slot.

The algorithm is DeepSeek's (their open-source EPLB), in two steps per layer:

1. **replicate**: every logical expert gets one copy; each extra slot goes to the expert
   whose load per copy is highest (ties: the lower id).
2. **pack**: physical experts, heaviest first, each go to the rank with the least load that
   still has a free slot (ties: prefer a rank not yet holding that expert, then the lower
   rank). Every rank ends with exactly ``n`` slots.

Where ranks span nodes (``num_nodes > 1`` and the router's expert groups divide among them),
the hierarchical form first packs whole expert groups onto nodes (DeepSeek's group-limited
routing then keeps a token's experts on few nodes), then replicates and packs within each
node. A token's load on a logical expert is split evenly over its copies: the router's choice
of copy (``ExpertMap.to_physical``) spreads tokens that way.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

Placement = tuple[int, ...]  # physical slot -> logical expert, for one MoE layer


def replicate(loads: Sequence[float], num_physical: int) -> list[int]:
    """Copies per logical expert: one each, then every extra slot to the hottest per copy.

    >>> replicate([9.0, 1.0, 2.0], 5)
    [3, 1, 1]
    """
    num_logical = len(loads)
    if num_physical < num_logical:
        raise ValueError(f"{num_physical} physical slots cannot hold {num_logical} experts")
    copies = [1] * num_logical
    for _ in range(num_physical - num_logical):
        hottest = max(range(num_logical), key=lambda e: (loads[e] / copies[e], -e))
        copies[hottest] += 1
    return copies


def pack(
    weights: Sequence[float], num_packs: int, labels: Sequence[int] | None = None
) -> list[list[int]]:
    """Items (indices into ``weights``) per pack, ``len(weights) // num_packs`` each, balanced.

    Greedy, heaviest item first (ties: lower index), into the lightest pack with room; among
    equally light packs, one not yet holding an item of the same ``label`` (two copies of one
    expert on one rank balance nothing), then the lower pack.
    """
    if num_packs < 1 or len(weights) % num_packs:
        raise ValueError(f"{len(weights)} items do not split evenly over {num_packs} packs")
    per_pack = len(weights) // num_packs
    labels = list(range(len(weights))) if labels is None else list(labels)
    packs: list[list[int]] = [[] for _ in range(num_packs)]
    load = [0.0] * num_packs
    held: list[set[int]] = [set() for _ in range(num_packs)]
    for item in sorted(range(len(weights)), key=lambda i: (-weights[i], i)):
        open_packs = [p for p in range(num_packs) if len(packs[p]) < per_pack]
        best = min(open_packs, key=lambda p: (load[p], labels[item] in held[p], p))
        packs[best].append(item)
        load[best] += weights[item]
        held[best].add(labels[item])
    return packs


@dataclass(frozen=True)
class Layout:
    """The physical shape every layer shares: slots, ranks, nodes, the router's groups."""

    num_logical: int
    num_physical: int
    num_ranks: int
    num_nodes: int = 1
    num_groups: int = 1  # the router's expert groups (DeepSeek's n_group); 1 = ungrouped

    def __post_init__(self) -> None:
        if self.num_ranks < 1 or self.num_physical % self.num_ranks:
            raise ValueError(
                f"{self.num_physical} physical experts do not split evenly over "
                f"{self.num_ranks} ranks"
            )
        if self.num_physical < self.num_logical:
            raise ValueError(
                f"{self.num_physical} physical experts cannot hold {self.num_logical} logical"
            )
        if self.num_nodes < 1 or self.num_ranks % self.num_nodes:
            raise ValueError(f"{self.num_ranks} ranks do not split evenly over {self.num_nodes}")
        if self.num_groups < 1 or self.num_logical % self.num_groups:
            raise ValueError(f"{self.num_logical} experts are not {self.num_groups} groups")

    @property
    def slots_per_rank(self) -> int:
        return self.num_physical // self.num_ranks

    @property
    def hierarchical(self) -> bool:
        """Whether groups go to nodes first: more than one node, and groups divide among them
        (with slots that divide too)."""
        return (
            self.num_nodes > 1
            and self.num_groups % self.num_nodes == 0
            and self.num_physical % self.num_nodes == 0
        )


def place_layer(loads: Sequence[float], layout: Layout) -> Placement:
    """One layer's ``physical_to_logical`` for the given logical loads (tokens routed)."""
    if len(loads) != layout.num_logical:
        raise ValueError(f"{len(loads)} expert loads for {layout.num_logical} experts")
    if any(not load >= 0 for load in loads):
        raise ValueError("expert loads must be numbers >= 0")
    if not layout.hierarchical:
        return _place_on_ranks(
            list(range(layout.num_logical)), loads, layout.num_physical, layout.num_ranks
        )
    group_size = layout.num_logical // layout.num_groups
    group_loads = [
        sum(loads[g * group_size : (g + 1) * group_size]) for g in range(layout.num_groups)
    ]
    ranks_per_node = layout.num_ranks // layout.num_nodes
    slots_per_node = layout.num_physical // layout.num_nodes
    placement: list[int] = []
    for groups in pack(group_loads, layout.num_nodes):
        experts = [g * group_size + i for g in sorted(groups) for i in range(group_size)]
        placement += _place_on_ranks(experts, loads, slots_per_node, ranks_per_node)
    return tuple(placement)


def _place_on_ranks(
    experts: list[int], loads: Sequence[float], num_slots: int, num_ranks: int
) -> Placement:
    """Replicate ``experts`` into ``num_slots`` and pack the copies over ``num_ranks``; each
    rank's slots in ascending logical order."""
    own = [float(loads[e]) for e in experts]
    copies = replicate(own, num_slots)
    physical = [experts[i] for i, c in enumerate(copies) for _ in range(c)]
    per_copy = [own[i] / c for i, c in enumerate(copies) for _ in range(c)]
    ranks = pack(per_copy, num_ranks, labels=physical)
    return tuple(e for items in ranks for e in sorted(physical[i] for i in items))


def place(loads: Sequence[Sequence[float]], layout: Layout) -> list[Placement]:
    """``place_layer`` for every layer."""
    return [place_layer(layer, layout) for layer in loads]


def initial_placement(layout: Layout) -> Placement:
    """Before any load is measured: contiguous blocks (expert ``e`` on rank ``e // n``, DeepEP's
    layout) when there are no redundant slots, else the placement of uniform loads."""
    if layout.num_physical == layout.num_logical:
        return tuple(range(layout.num_logical))
    return place_layer([1.0] * layout.num_logical, layout)


def copies_of(placement: Placement, num_logical: int) -> list[int]:
    """Physical copies per logical expert."""
    copies = [0] * num_logical
    for expert in placement:
        copies[expert] += 1
    return copies


def rank_loads(placement: Placement, loads: Sequence[float], num_ranks: int) -> list[float]:
    """Tokens each rank computes: a logical expert's load split evenly over its copies."""
    copies = copies_of(placement, len(loads))
    per_rank = len(placement) // num_ranks
    return [
        sum(loads[e] / copies[e] for e in placement[r * per_rank : (r + 1) * per_rank])
        for r in range(num_ranks)
    ]


def balancedness(per_rank: Sequence[float]) -> float:
    """Mean over max tokens per rank (vLLM's measure): 1.0 is perfect; no load counts as 1."""
    peak = max(per_rank, default=0.0)
    return 1.0 if peak <= 0 else sum(per_rank) / len(per_rank) / peak


def check_placement(placement: Sequence[int], layout: Layout) -> Placement:
    """``placement`` as a tuple, refused unless it fills every slot with a logical expert and
    leaves none without a copy."""
    if len(placement) != layout.num_physical:
        raise ValueError(
            f"a placement has {len(placement)} slots; this group has {layout.num_physical}"
        )
    bad = [
        e
        for e in placement
        if isinstance(e, bool) or not isinstance(e, int) or not 0 <= e < layout.num_logical
    ]
    if bad:
        raise ValueError(
            f"placement names expert {bad[0]!r}; the model has "
            f"{layout.num_logical} (0..{layout.num_logical - 1})"
        )
    missing = sorted(set(range(layout.num_logical)) - set(placement))
    if missing:
        raise ValueError(f"placement leaves expert(s) {missing[:8]} without a copy")
    return tuple(placement)


@dataclass(frozen=True)
class Move:
    """One physical expert's weights copied into a new slot, from a rank that holds them."""

    expert: int  # logical
    src_rank: int
    src_slot: int  # local slot on the source rank (in the old placement)
    dst_rank: int
    dst_slot: int  # local slot on the destination rank (in the new placement)


# A layer is re-placed only when that raises its balancedness (on the window's loads) by at
# least this much: smaller gains are within a window's noise and not worth moving weights.
MIN_GAIN = 0.02


def replace_layer(
    old: Placement, loads: Sequence[float], layout: Layout, min_gain: float = MIN_GAIN
) -> Placement:
    """A rebalance's next placement of one layer: the algorithm's for ``loads``, its packs on
    the ranks that hold most of them (``match_ranks``) and its experts in the slots they hold
    (``keep_in_place``); ``old`` itself unless that raises balancedness by ``min_gain``.

    Greedy packing is not stable: two windows of nearly the same loads can interleave the
    experts differently, and re-placing on every window would move half of them for nothing.
    """
    world = layout.num_ranks
    nodes = layout.num_nodes if layout.hierarchical else 1
    new = match_ranks(old, place_layer(loads, layout), world, world // nodes)
    new = keep_in_place(old, new, world)
    gain = balancedness(rank_loads(new, loads, world)) - balancedness(rank_loads(old, loads, world))
    return new if gain >= min_gain else old


def match_ranks(
    old: Placement, new: Placement, num_ranks: int, ranks_per_node: int | None = None
) -> Placement:
    """``new`` with its rank blocks given to the ranks that already hold most of them.

    ``place_layer`` packs experts onto ranks without looking at where they are: two windows
    of nearly the same loads can come back with the packs swapped between ranks, and moving
    them would cost a rebalance half of the experts for nothing. Any permutation of the packs
    balances the same, so each pack goes to the rank sharing the most experts with it
    (greedily, ties to the lower rank and pack), within its node where ranks span nodes (the
    hierarchical placement's groups stay on their node).
    """
    per_rank = len(new) // num_ranks
    node = ranks_per_node or num_ranks
    blocks = [list(new[r * per_rank : (r + 1) * per_rank]) for r in range(num_ranks)]
    held = [list(old[r * per_rank : (r + 1) * per_rank]) for r in range(num_ranks)]
    owner: dict[int, int] = {}
    for first in range(0, num_ranks, node):
        ranks = range(first, first + node)
        pairs = sorted((-_shared(blocks[p], held[r]), r, p) for r in ranks for p in ranks)
        taken: set[int] = set()
        for _, rank, pack in pairs:
            if rank not in owner and pack not in taken:
                owner[rank] = pack
                taken.add(pack)
    return tuple(e for r in range(num_ranks) for e in blocks[owner[r]])


def _shared(pack: Sequence[int], held: Sequence[int]) -> int:
    """Experts of ``pack`` a rank holding ``held`` has already (copies counted)."""
    rest = list(held)
    count = 0
    for expert in pack:
        if expert in rest:
            rest.remove(expert)
            count += 1
    return count


def keep_in_place(old: Placement, new: Placement, num_ranks: int) -> Placement:
    """``new`` with each rank's experts reordered so that an expert the rank already held stays
    in its old slot: the same experts per rank, fewer weights to copy."""
    per_rank = len(new) // num_ranks
    result: list[int] = []
    for r in range(num_ranks):
        lo, hi = r * per_rank, (r + 1) * per_rank
        wanted = list(new[lo:hi])
        slots: list[int | None] = [None] * per_rank
        for i, expert in enumerate(old[lo:hi]):
            if expert in wanted:
                slots[i] = expert
                wanted.remove(expert)
        rest = iter(sorted(wanted))
        result += [s if s is not None else next(rest) for s in slots]
    return tuple(result)


def move_plan(old: Placement, new: Placement, num_ranks: int) -> list[Move]:
    """The copies that turn ``old`` into ``new``: every slot whose expert changes reads it from
    its own rank when held there (a local copy), else from the old holder that sends least so
    far (ties: the lower rank). Ordered by destination rank and slot."""
    per_rank = len(new) // num_ranks
    holders: dict[int, list[tuple[int, int]]] = {}
    for slot, expert in enumerate(old):
        holders.setdefault(expert, []).append((slot // per_rank, slot % per_rank))
    sends = [0] * num_ranks
    moves: list[Move] = []
    for slot, expert in enumerate(new):
        if old[slot] == expert:
            continue
        dst_rank, dst_slot = divmod(slot, per_rank)
        sources = holders.get(expert)
        if not sources:
            raise ValueError(f"expert {expert} has no copy in the old placement to move from")
        local = [s for s in sources if s[0] == dst_rank]
        src_rank, src_slot = local[0] if local else min(sources, key=lambda s: (sends[s[0]], s))
        if not local:
            sends[src_rank] += 1
        moves.append(Move(expert, src_rank, src_slot, dst_rank, dst_slot))
    return moves
