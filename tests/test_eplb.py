"""EPLB's placement math and its neighbours, as tables: no process group, CPU only, fast.

``kernels/moe/eplb.py`` (replicate, pack, place, keep_in_place, move_plan and the measures),
``ExpertMap.to_physical`` (slot choice: valid, batch-invariant, even over copies),
``ExpertLoad`` (the window ring), the placement file, ``ExpertPlacement`` with redundant
slots and the ``ServerArgs`` refusals of ``check_expert_flags``. Expected placements below are
worked by hand from the documented greedy rules (heaviest first, lightest rank, ties to the
lower id / rank).
"""

from __future__ import annotations

import json
import random
import re
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from roundgate.actors.server_args import ServerArgs
from roundgate.kernels.moe.eplb import (
    MIN_GAIN,
    Layout,
    Move,
    Placement,
    balancedness,
    check_placement,
    copies_of,
    initial_placement,
    keep_in_place,
    match_ranks,
    move_plan,
    pack,
    place,
    place_layer,
    rank_loads,
    replace_layer,
    replicate,
)
from roundgate.kernels.moe.expert_load import ExpertLoad
from roundgate.kernels.moe.expert_map import ExpertMap
from roundgate.kernels.moe.placement import ExpertPlacement
from roundgate.kernels.moe.placement_file import FLAG, read_placement_file, write_placement_file
from roundgate.kernels.moe.rehome import grown_layout, rehome_layer


def refuses(*parts: str) -> Any:
    """``ValueError`` whose message holds every one of ``parts`` (in order)."""
    return pytest.raises(ValueError, match=".*".join(re.escape(p) for p in parts))


def ranks_of(placement: Placement, num_ranks: int) -> list[tuple[int, ...]]:
    n = len(placement) // num_ranks
    return [tuple(placement[r * n : (r + 1) * n]) for r in range(num_ranks)]


def apply(old: Placement, moves: list[Move], num_ranks: int) -> Placement:
    """The moves run as one all-to-all: every source read from ``old`` before any write."""
    n = len(old) // num_ranks
    reads = [(m, old[m.src_rank * n + m.src_slot]) for m in moves]
    after = list(old)
    for m, expert in reads:
        after[m.dst_rank * n + m.dst_slot] = expert
    return tuple(after)


def random_loads(seed: int, num_logical: int) -> list[float]:
    rng = random.Random(seed)
    # Skewed, with some zero loads: a few hot experts, as real routing gives.
    return [
        float(rng.choice([0, 0, 1, 2, 5, 40, 300]) * rng.randint(1, 9)) for _ in range(num_logical)
    ]


# Layouts the property tables sweep: flat, redundant, and hierarchical (groups -> nodes).
LAYOUTS = [
    Layout(4, 4, 2),
    Layout(4, 6, 2),
    Layout(8, 8, 4),
    Layout(8, 12, 4),
    Layout(16, 20, 4),
    Layout(6, 9, 3),
    Layout(8, 8, 4, num_nodes=2, num_groups=4),
    Layout(8, 12, 4, num_nodes=2, num_groups=4),
    Layout(16, 24, 8, num_nodes=4, num_groups=8),
    Layout(16, 16, 4, num_nodes=2, num_groups=2),
]
SEEDS = [0, 1, 2, 3]
CASES = [
    pytest.param(layout, seed, id=f"{i}-seed{seed}")
    for i, layout in enumerate(LAYOUTS)
    for seed in SEEDS
]


# ---- replicate ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("loads", "num_physical", "copies"),
    [
        ([9.0, 1.0, 2.0], 3, [1, 1, 1]),  # no extra slot
        ([9.0, 1.0, 2.0], 5, [3, 1, 1]),  # the docstring's case
        ([100.0, 1.0, 1.0, 1.0], 7, [4, 1, 1, 1]),  # one hot expert takes every extra
        ([6.0, 2.0, 2.0, 2.0], 6, [3, 1, 1, 1]),  # 6 -> 3, 3 -> 2, 2, 2
        ([4.0, 4.0, 1.0, 1.0], 6, [2, 2, 1, 1]),  # tie 4 vs 4: lower id first, then the other
        ([4.0, 4.0, 1.0, 1.0], 5, [2, 1, 1, 1]),
        ([0.0, 0.0, 0.0], 5, [3, 1, 1]),  # all ties: the lowest id
        ([1.0, 1.0, 1.0, 1.0], 6, [2, 2, 1, 1]),
        ([1.0, 8.0, 3.0], 6, [1, 3, 2]),  # 8 -> e1, 4 > 3 -> e1, 3 > 8/3 -> e2
    ],
)
def test_replicate(loads: list[float], num_physical: int, copies: list[int]) -> None:
    assert replicate(loads, num_physical) == copies


@pytest.mark.parametrize(("num_logical", "num_physical"), [(4, 3), (8, 0)])
def test_replicate_refuses_fewer_slots_than_experts(num_logical: int, num_physical: int) -> None:
    with refuses(f"{num_physical} physical slots cannot hold {num_logical} experts"):
        replicate([1.0] * num_logical, num_physical)


# ---- pack -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("weights", "num_packs", "labels", "packs"),
    [
        # Heaviest first into the lightest pack: 5->p0, 4->p1, 3->p1, 3->p0, 2->p1, 1->p0.
        ([5, 4, 3, 3, 2, 1], 2, None, [[0, 3, 5], [1, 2, 4]]),
        ([4, 4, 2, 2], 2, None, [[0, 2], [1, 3]]),
        ([3, 3, 2, 2, 1, 1], 3, None, [[0, 4], [1, 5], [2, 3]]),
        ([1, 1, 1, 1], 1, None, [[0, 1, 2, 3]]),
        ([1, 1, 1, 1], 4, None, [[0], [1], [2], [3]]),
        # Equal weights, labels: at a load tie the pack without that label wins.
        ([2, 2, 2, 2], 2, [0, 0, 1, 1], [[0, 2], [1, 3]]),
        # Items 0, 1 (label 7) tie on load 0: 0 -> p0, 1 -> p1 (lighter); item 2 (label 7)
        # ties p0/p1 at 1, both hold 7 -> p0; item 3 (label 8) -> p1.
        ([1, 1, 1, 1], 2, [7, 7, 7, 8], [[0, 2], [1, 3]]),
        # Load beats labels: item 2 (label 1) joins item 1 (label 1) in the lighter pack.
        ([3, 1, 1, 1], 2, [0, 1, 1, 2], [[0, 3], [1, 2]]),
    ],
)
def test_pack(
    weights: list[float], num_packs: int, labels: list[int] | None, packs: list[list[int]]
) -> None:
    got = pack(weights, num_packs, labels)
    assert got == packs
    assert sorted(i for p in got for i in p) == list(range(len(weights)))
    assert {len(p) for p in got} == {len(weights) // num_packs}


@pytest.mark.parametrize(("num_items", "num_packs"), [(5, 2), (4, 0), (3, 4)])
def test_pack_refuses_uneven_splits(num_items: int, num_packs: int) -> None:
    with refuses(f"{num_items} items do not split evenly over {num_packs} packs"):
        pack([1.0] * num_items, num_packs)


# ---- Layout ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(num_logical=4, num_physical=5, num_ranks=2), "5 physical experts do not split"),
        (dict(num_logical=4, num_physical=4, num_ranks=0), "do not split evenly over 0 ranks"),
        (dict(num_logical=8, num_physical=6, num_ranks=2), "6 physical experts cannot hold 8"),
        (dict(num_logical=8, num_physical=8, num_ranks=4, num_nodes=3), "4 ranks do not split"),
        (dict(num_logical=8, num_physical=8, num_ranks=4, num_groups=3), "8 experts are not 3"),
        (dict(num_logical=8, num_physical=8, num_ranks=4, num_groups=0), "8 experts are not 0"),
    ],
)
def test_layout_refuses(kwargs: dict[str, int], message: str) -> None:
    with refuses(message):
        Layout(**kwargs)


@pytest.mark.parametrize(
    ("layout", "slots_per_rank", "hierarchical"),
    [
        (Layout(4, 4, 2), 2, False),
        (Layout(4, 6, 2), 3, False),
        (Layout(8, 8, 4, num_nodes=2, num_groups=4), 2, True),
        (Layout(8, 12, 4, num_nodes=2, num_groups=4), 3, True),
        (Layout(8, 8, 4, num_nodes=2, num_groups=1), 2, False),  # one group: flat
        (Layout(6, 6, 2, num_nodes=2, num_groups=3), 3, False),  # 3 groups over 2 nodes
        (Layout(8, 8, 4, num_nodes=1, num_groups=4), 2, False),  # one node
    ],
)
def test_layout_shape(layout: Layout, slots_per_rank: int, hierarchical: bool) -> None:
    assert layout.slots_per_rank == slots_per_rank
    assert layout.hierarchical is hierarchical


# ---- place_layer: hand-worked placements ----------------------------------------------------


@pytest.mark.parametrize(
    ("loads", "layout", "placement", "per_rank"),
    [
        # No redundancy: 0->r0, 1->r1, 2->r0 (tie, lower), 3->r1.
        ([4, 4, 2, 2], Layout(4, 4, 2), (0, 2, 1, 3), [6, 6]),
        ([3, 3, 2, 2, 1, 1], Layout(6, 6, 3), (0, 4, 1, 5, 2, 3), [4, 4, 4]),
        # The hot expert alone: rank 0 takes 6 + 2 (rank 1 is full), balancedness 0.75 ...
        ([6, 2, 2, 2], Layout(4, 4, 2), (0, 3, 1, 2), [8, 4]),
        # ... with 2 redundant slots it gets 3 copies of 2 each: exactly 6 and 6.
        ([6, 2, 2, 2], Layout(4, 6, 2), (0, 0, 2, 0, 1, 3), [6, 6]),
        # copies [3,1,1,1] (8/3 each): ranks {0,0,2} and {0,1,3}: 19/3 and 17/3.
        ([8, 1, 1, 2], Layout(4, 6, 2), (0, 0, 2, 0, 1, 3), [19 / 3, 17 / 3]),
        # Uniform loads: copies [2,2,1,1] (ties to the lower id), packed into {0,1,2},{0,1,3}.
        ([1, 1, 1, 1], Layout(4, 6, 2), (0, 1, 2, 0, 1, 3), [2.0, 2.0]),
        # Hierarchical: groups {0,1} {2,3} {4,5} {6,7} weigh 10, 0, 10, 2: node 0 takes groups
        # 0 and 3, node 1 groups 2 and 1; then experts pack within each node's two ranks.
        (
            [10, 0, 0, 0, 5, 5, 1, 1],
            Layout(8, 8, 4, num_nodes=2, num_groups=4),
            (0, 1, 6, 7, 2, 4, 3, 5),
            [10, 2, 5, 5],
        ),
        # The same loads flat: 0->r0, 4->r1, 5->r2, 6,7->r3, then 1, 2, 3 fill r1, r2, r0,
        # splitting group {4,5} over ranks 1 and 2 (two nodes, were there two).
        ([10, 0, 0, 0, 5, 5, 1, 1], Layout(8, 8, 4), (0, 3, 1, 4, 2, 5, 6, 7), [10, 5, 5, 2]),
    ],
)
def test_place_layer_known_cases(
    loads: list[float], layout: Layout, placement: Placement, per_rank: list[float]
) -> None:
    got = place_layer(loads, layout)
    assert got == placement
    assert rank_loads(got, loads, layout.num_ranks) == pytest.approx(per_rank)


@pytest.mark.parametrize(
    ("loads", "shape", "before", "after"),
    [
        # [6,2,2,2]: 8 vs 4 -> three copies of expert 0, 6 vs 6.
        ([6, 2, 2, 2], (4, 2), 0.75, 1.0),
        # 30 -> r0 and seven 10s: 40, 20, 20, 20; with 4 more slots copies [4,2,1,...]: 25 each.
        ([30, 10, 10, 10, 10, 10, 10, 10], (8, 4), 0.625, 1.0),
        # A lone hot expert: 12 vs 0; with one extra slot per rank three copies of 4: 8 vs 4.
        ([12, 0, 0, 0], (4, 2), 0.5, 0.75),
    ],
)
def test_redundant_slots_raise_balancedness(
    loads: list[float], shape: tuple[int, int], before: float, after: float
) -> None:
    num_logical, num_ranks = shape
    plain = place_layer(loads, Layout(num_logical, num_logical, num_ranks))
    extra = place_layer(loads, Layout(num_logical, num_logical + num_ranks, num_ranks))
    assert balancedness(rank_loads(plain, loads, num_ranks)) == pytest.approx(before)
    assert balancedness(rank_loads(extra, loads, num_ranks)) == pytest.approx(after)


@pytest.mark.parametrize(
    ("loads", "layout", "hot", "copies"),
    [
        ([1, 50, 1, 1], Layout(4, 6, 2), 1, 3),
        ([1, 1, 1, 1, 1, 1, 1, 90], Layout(8, 12, 4), 7, 5),
        ([9, 0, 0, 0, 0, 8], Layout(6, 9, 3), 0, 3),  # 9 -> 4.5 > 4 -> 3 copies; 8 gets 2
        ([1, 1, 1, 20, 20, 1, 1, 1], Layout(8, 12, 4), 3, 3),
    ],
)
def test_hottest_expert_gets_the_replicas(
    loads: list[float], layout: Layout, hot: int, copies: int
) -> None:
    got = copies_of(place_layer(loads, layout), layout.num_logical)
    assert got[hot] == copies == max(got)
    cold = [e for e, load in enumerate(loads) if load < max(loads) / 2]
    assert all(got[e] == 1 for e in cold)


# ---- place_layer: properties over every layout ----------------------------------------------


@pytest.mark.parametrize(("layout", "seed"), CASES)
def test_placement_properties(layout: Layout, seed: int) -> None:
    loads = random_loads(seed, layout.num_logical)
    got = place_layer(loads, layout)
    assert check_placement(got, layout) == got
    assert len(got) == layout.num_physical
    copies = copies_of(got, layout.num_logical)
    assert min(copies) >= 1
    assert sum(copies) == layout.num_physical
    ranks = ranks_of(got, layout.num_ranks)
    assert all(len(r) == layout.slots_per_rank for r in ranks)
    assert all(list(r) == sorted(r) for r in ranks)  # each rank's slots in logical order
    # Every token is counted once over the ranks.
    assert sum(rank_loads(got, loads, layout.num_ranks)) == pytest.approx(sum(loads))
    assert place_layer(loads, layout) == got  # deterministic
    if not layout.hierarchical:  # flat: copies are exactly replicate's
        assert copies == replicate(loads, layout.num_physical)


@pytest.mark.parametrize(("layout", "seed"), [c for c in CASES if c.values[0].hierarchical])
def test_hierarchical_keeps_each_group_on_one_node(layout: Layout, seed: int) -> None:
    loads = random_loads(seed, layout.num_logical)
    got = place_layer(loads, layout)
    group_size = layout.num_logical // layout.num_groups
    per_node = layout.num_physical // layout.num_nodes
    nodes_of_group: dict[int, set[int]] = {}
    for slot, expert in enumerate(got):
        nodes_of_group.setdefault(expert // group_size, set()).add(slot // per_node)
    assert all(len(nodes) == 1 for nodes in nodes_of_group.values()), nodes_of_group
    # Every node holds the same number of whole groups.
    groups_per_node = Counter(next(iter(n)) for n in nodes_of_group.values())
    assert set(groups_per_node.values()) == {layout.num_groups // layout.num_nodes}


@pytest.mark.parametrize(
    ("grouped", "flat"),
    [
        (Layout(8, 8, 4, num_nodes=2, num_groups=1), Layout(8, 8, 4)),
        (Layout(6, 6, 2, num_nodes=2, num_groups=3), Layout(6, 6, 2)),
        (Layout(8, 12, 4, num_nodes=1, num_groups=4), Layout(8, 12, 4)),
    ],
)
def test_not_hierarchical_places_flat(grouped: Layout, flat: Layout) -> None:
    for seed in SEEDS:
        loads = random_loads(seed, grouped.num_logical)
        assert place_layer(loads, grouped) == place_layer(loads, flat)


@pytest.mark.parametrize(
    ("loads", "message"),
    [
        ([1.0, 1.0, 1.0], "3 expert loads for 4 experts"),
        ([1.0, 1.0, 1.0, 1.0, 1.0], "5 expert loads for 4 experts"),
        ([1.0, -1.0, 1.0, 1.0], "expert loads must be numbers >= 0"),
        ([1.0, float("nan"), 1.0, 1.0], "expert loads must be numbers >= 0"),
    ],
)
def test_place_layer_refuses_bad_loads(loads: list[float], message: str) -> None:
    with refuses(message):
        place_layer(loads, Layout(4, 6, 2))


def test_place_is_place_layer_per_layer() -> None:
    layout = Layout(8, 12, 4, num_nodes=2, num_groups=4)
    loads = [random_loads(seed, 8) for seed in SEEDS]
    assert place(loads, layout) == [place_layer(layer, layout) for layer in loads]
    assert place([], layout) == []


@pytest.mark.parametrize(
    ("layout", "placement"),
    [
        (Layout(4, 4, 2), (0, 1, 2, 3)),  # no redundancy: DeepEP's contiguous blocks
        (Layout(8, 8, 4), tuple(range(8))),
        (Layout(8, 8, 4, num_nodes=2, num_groups=4), tuple(range(8))),
        (Layout(4, 6, 2), (0, 1, 2, 0, 1, 3)),  # uniform loads placed (see above)
        (Layout(2, 4, 2), (0, 1, 0, 1)),
    ],
)
def test_initial_placement(layout: Layout, placement: Placement) -> None:
    assert initial_placement(layout) == placement
    assert check_placement(placement, layout) == placement


# ---- measures -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("placement", "num_logical", "copies"),
    [
        ((0, 1, 2, 3), 4, [1, 1, 1, 1]),
        ((0, 0, 2, 0, 1, 3), 4, [3, 1, 1, 1]),
        ((1, 1), 3, [0, 2, 0]),
        ((), 2, [0, 0]),
    ],
)
def test_copies_of(placement: Placement, num_logical: int, copies: list[int]) -> None:
    assert copies_of(placement, num_logical) == copies


@pytest.mark.parametrize(
    ("placement", "loads", "num_ranks", "per_rank"),
    [
        ((0, 1, 2, 3), [4, 3, 2, 1], 2, [7, 3]),
        ((0, 1, 2, 3), [4, 3, 2, 1], 4, [4, 3, 2, 1]),
        ((0, 1, 2, 3), [4, 3, 2, 1], 1, [10]),
        ((0, 0, 2, 0, 1, 3), [6, 2, 2, 2], 2, [6, 6]),  # a load split evenly over copies
        ((0, 1, 0, 2), [8, 1, 3], 2, [5, 7]),
    ],
)
def test_rank_loads(
    placement: Placement, loads: list[float], num_ranks: int, per_rank: list[float]
) -> None:
    assert rank_loads(placement, loads, num_ranks) == pytest.approx(per_rank)


@pytest.mark.parametrize(
    ("per_rank", "expected"),
    [
        ([], 1.0),
        ([0, 0], 1.0),  # no load counts as balanced
        ([5], 1.0),
        ([6, 6], 1.0),
        ([8, 4], 0.75),
        ([3, 1, 0, 0], 1 / 3),  # mean 1 over max 3
        ([10, 0], 0.5),
        ([2, 4, 6, 8], 0.625),
    ],
)
def test_balancedness(per_rank: list[float], expected: float) -> None:
    assert balancedness(per_rank) == pytest.approx(expected)


# ---- check_placement ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("placement", "message"),
    [
        ([0, 1, 2], "a placement has 3 slots; this group has 6"),
        ([0, 1, 2, 3, 0, 1, 2], "a placement has 7 slots; this group has 6"),
        ([0, 1, 2, 3, 4, 0], "placement names expert 4; the model has 4 (0..3)"),
        ([0, 1, 2, 3, -1, 0], "placement names expert -1"),
        ([0, 1, 2, 3, 1.0, 0], "placement names expert 1.0"),
        ([0, 1, 2, 3, "1", 0], "placement names expert '1'"),
        ([0, 1, 2, 3, None, 0], "placement names expert None"),
        ([0, 0, 1, 1, 2, 2], "placement leaves expert(s) [3] without a copy"),
        ([0, 0, 0, 0, 0, 0], "placement leaves expert(s) [1, 2, 3] without a copy"),
    ],
)
def test_check_placement_refuses(placement: list[object], message: str) -> None:
    with refuses(message):
        check_placement(placement, Layout(4, 6, 2))  # type: ignore[arg-type]


def test_check_placement_refuses_bools() -> None:
    with refuses("placement names expert True"):
        check_placement([0, True, 2, 3, 0, 1], Layout(4, 6, 2))


# ---- keep_in_place and move_plan ------------------------------------------------------------


@pytest.mark.parametrize(
    ("old", "new", "num_ranks", "kept"),
    [
        ((0, 1, 2, 3), (0, 1, 2, 3), 2, (0, 1, 2, 3)),
        ((0, 1, 2, 3), (1, 0, 3, 2), 2, (0, 1, 2, 3)),  # same sets: nothing moves
        ((0, 1, 2, 3), (2, 0, 1, 3), 2, (0, 2, 1, 3)),  # 0 and 3 keep their slots
        ((0, 1, 2, 3), (1, 2, 0, 3), 2, (2, 1, 0, 3)),
        # Duplicates: rank 0 held one 0; the second 0 fills the freed slot.
        ((0, 1, 2, 0, 1, 3), (0, 0, 2, 0, 1, 3), 2, (0, 0, 2, 0, 1, 3)),
        ((0, 1, 2, 0, 1, 3), (0, 0, 3, 1, 1, 2), 2, (0, 0, 3, 1, 1, 2)),
        ((3, 3, 1, 0, 2, 2), (2, 3, 3, 0, 1, 1), 2, (3, 3, 2, 0, 1, 1)),
        # Unkept experts fill the free slots in ascending order.
        ((0, 1, 2, 3, 4, 5), (5, 4, 3, 2, 1, 0), 2, (3, 4, 5, 0, 1, 2)),
        ((0, 1, 2, 3, 4, 5), (5, 4, 3, 2, 1, 0), 1, (0, 1, 2, 3, 4, 5)),
    ],
)
def test_keep_in_place(old: Placement, new: Placement, num_ranks: int, kept: Placement) -> None:
    got = keep_in_place(old, new, num_ranks)
    assert got == kept
    for got_rank, new_rank in zip(ranks_of(got, num_ranks), ranks_of(new, num_ranks), strict=True):
        assert Counter(got_rank) == Counter(new_rank)


@pytest.mark.parametrize(("layout", "seed"), CASES)
def test_keep_in_place_properties(layout: Layout, seed: int) -> None:
    old = place_layer(random_loads(seed, layout.num_logical), layout)
    new = place_layer(random_loads(seed + 100, layout.num_logical), layout)
    got = keep_in_place(old, new, layout.num_ranks)
    check_placement(got, layout)
    for r, (o, n, g) in enumerate(
        zip(*(ranks_of(p, layout.num_ranks) for p in (old, new, got)), strict=True)
    ):
        assert Counter(g) == Counter(n), r  # the multiset per rank never changes
        kept = Counter(o) & Counter(n)  # experts the rank holds before and after
        in_place = Counter(e for e, before in zip(g, o, strict=True) if e == before)
        assert in_place == kept, r  # each of them in one of its old slots
    assert keep_in_place(old, old, layout.num_ranks) == old
    assert keep_in_place(got, new, layout.num_ranks) == got  # idempotent


@pytest.mark.parametrize(
    ("old", "new", "num_ranks", "moves"),
    [
        ((0, 1, 2, 3), (0, 1, 2, 3), 2, []),
        # Swapped between ranks: 2 from rank 1 slot 0, 1 from rank 0 slot 1.
        ((0, 1, 2, 3), (0, 2, 1, 3), 2, [Move(2, 1, 0, 0, 1), Move(1, 0, 1, 1, 0)]),
        # A second copy on the same rank: a local copy.
        ((0, 1, 2, 3), (0, 0, 2, 3), 2, [Move(0, 0, 0, 0, 1)]),
        # A rank-local swap: both read from the old slots (reads before writes).
        ((0, 1, 2, 3), (1, 0, 2, 3), 2, [Move(1, 0, 1, 0, 0), Move(0, 0, 0, 0, 1)]),
        # Two ranks need expert 0, held by ranks 0 and 1: one send each (least sends so far).
        (
            (0, 1, 0, 2, 3, 4, 5, 6),
            (0, 1, 0, 2, 0, 4, 0, 6),
            4,
            [Move(0, 0, 0, 2, 0), Move(0, 1, 0, 3, 0)],
        ),
        # A local holder wins over a remote one with fewer sends.
        (
            (0, 1, 0, 2),
            (0, 0, 0, 2),
            2,
            [Move(0, 0, 0, 0, 1)],
        ),
    ],
)
def test_move_plan_known_cases(
    old: Placement, new: Placement, num_ranks: int, moves: list[Move]
) -> None:
    got = move_plan(old, new, num_ranks)
    assert got == moves
    assert apply(old, got, num_ranks) == new


def test_move_plan_refuses_an_expert_with_no_old_copy() -> None:
    with refuses("expert 4 has no copy in the old placement to move from"):
        move_plan((0, 1, 2, 3), (0, 1, 2, 4), 2)


@pytest.mark.parametrize(("layout", "seed"), CASES)
def test_move_plan_turns_old_into_new(layout: Layout, seed: int) -> None:
    n = layout.slots_per_rank
    old = place_layer(random_loads(seed, layout.num_logical), layout)
    new = keep_in_place(
        old, place_layer(random_loads(seed + 7, layout.num_logical), layout), layout.num_ranks
    )
    moves = move_plan(old, new, layout.num_ranks)
    assert apply(old, moves, layout.num_ranks) == new
    assert move_plan(old, new, layout.num_ranks) == moves  # deterministic
    # Only slots whose expert changed are written, each once, in slot order.
    written = [m.dst_rank * n + m.dst_slot for m in moves]
    assert written == [s for s in range(len(new)) if old[s] != new[s]]
    for m in moves:
        assert old[m.src_rank * n + m.src_slot] == m.expert == new[m.dst_rank * n + m.dst_slot]
        assert 0 <= m.src_slot < n and 0 <= m.dst_slot < n
        held_locally = m.expert in old[m.dst_rank * n : (m.dst_rank + 1) * n]
        assert (m.src_rank == m.dst_rank) == held_locally  # local when it can be
    # After keep_in_place, a rank receives exactly the experts it did not hold: what changed
    # owner, no more.
    for r, (o, w) in enumerate(
        zip(ranks_of(old, layout.num_ranks), ranks_of(new, layout.num_ranks), strict=True)
    ):
        arriving = Counter(m.expert for m in moves if m.dst_rank == r)
        assert arriving == Counter(w) - Counter(o), r
    assert move_plan(new, new, layout.num_ranks) == []


# ---- ExpertMap.to_physical ------------------------------------------------------------------


def expert_map(ptl: Placement, world: int = 2, rank: int = 0) -> ExpertMap:
    placement = ExpertPlacement(4, world, rank, len(ptl) - 4)
    return ExpertMap(placement, ptl)


MAPS = [
    pytest.param((0, 0, 1, 0, 2, 3), 2, 0, id="3-copies-r0"),
    pytest.param((0, 0, 1, 0, 2, 3), 2, 1, id="3-copies-r1"),
    pytest.param((0, 1, 2, 3, 0, 1), 2, 1, id="2+2-copies"),
    pytest.param((3, 0, 1, 2, 0, 0, 3, 3), 4, 2, id="3+3-copies-w4"),
    pytest.param((2, 3, 0, 1), 2, 0, id="permuted-no-redundancy"),
]


def test_to_physical_identity_fast_path() -> None:
    m = expert_map((0, 1, 2, 3))
    assert m.identity
    ids = torch.tensor([[0, 3], [2, 1]])
    assert m.to_physical(ids, torch.tensor([5, 9])) is ids
    assert m.to_physical(ids) is ids


@pytest.mark.parametrize(("ptl", "world", "rank"), MAPS)
def test_to_physical_picks_a_copy_of_the_requested_expert(
    ptl: Placement, world: int, rank: int
) -> None:
    m = expert_map(ptl, world, rank)
    assert not m.identity
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 4, (257, 2), generator=gen)
    positions = torch.randint(0, 2**31 - 1, (257,), generator=gen)
    for pos in (positions, None):
        slots = m.to_physical(ids, pos)
        assert slots.shape == ids.shape and slots.dtype == torch.long
        table = torch.tensor(ptl)
        assert torch.equal(table[slots], ids)


@pytest.mark.parametrize(("ptl", "world", "rank"), MAPS)
def test_to_physical_is_batch_invariant(ptl: Placement, world: int, rank: int) -> None:
    m = expert_map(ptl, world, rank)
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 4, (64, 2), generator=gen)
    positions = torch.randint(0, 100_000, (64,), generator=gen)
    batch = m.to_physical(ids, positions)
    for t in range(ids.shape[0]):  # the token alone
        assert torch.equal(m.to_physical(ids[t : t + 1], positions[t : t + 1])[0], batch[t])
    order = torch.randperm(64, generator=gen)  # the token among other neighbours
    assert torch.equal(m.to_physical(ids[order], positions[order]), batch[order])
    assert torch.equal(m.to_physical(ids[:7], positions[:7]), batch[:7])


@pytest.mark.parametrize(
    ("ptl", "world", "rank", "expert", "start"),
    [
        ((0, 0, 1, 0, 2, 3), 2, 0, 0, 0),
        ((0, 0, 1, 0, 2, 3), 2, 1, 0, 12_345),
        ((0, 1, 2, 3, 0, 1), 2, 0, 1, 7),
        ((0, 1, 2, 3, 0, 0, 0, 0), 2, 1, 0, 0),  # 5 copies
        ((3, 0, 1, 2, 0, 0, 3, 3), 4, 3, 3, 1_000_000),
    ],
)
def test_to_physical_spreads_over_copies(
    ptl: Placement, world: int, rank: int, expert: int, start: int
) -> None:
    m = expert_map(ptl, world, rank)
    num = 3000
    ids = torch.full((num, 1), expert)
    slots = m.to_physical(ids, torch.arange(start, start + num))
    counts = Counter(slots[:, 0].tolist())
    copies = [s for s, e in enumerate(ptl) if e == expert]
    assert set(counts) == set(copies)
    share = num / len(copies)
    assert all(abs(counts[s] - share) < 0.15 * share for s in copies), counts


def test_to_physical_spreads_a_decode_batch_of_one_parity() -> None:
    # Positions that advance together and share a parity still split over two copies.
    m = expert_map((0, 1, 2, 3, 0, 1))
    for step in range(4):
        positions = torch.arange(0, 128, 2) + 1000 + step * 2
        slots = m.to_physical(torch.zeros(64, 1, dtype=torch.long), positions)
        counts = Counter(slots[:, 0].tolist())
        assert set(counts) == {0, 4} and min(counts.values()) >= 16, counts


@pytest.mark.parametrize(
    ("ptl", "message"),
    [
        ((0, 1, 2, 3, 0), "a layer's placement has 5 slots, the group 6"),
        ((0, 0, 1, 1, 2, 2), "placement leaves expert 3 without a copy"),
    ],
)
def test_expert_map_refuses(ptl: Placement, message: str) -> None:
    with refuses(message):
        ExpertMap(ExpertPlacement(4, 2, 0, 2), ptl)


@pytest.mark.parametrize(("rank", "local"), [(0, (0, 0, 1)), (1, (0, 2, 3))])
def test_local_logical(rank: int, local: tuple[int, ...]) -> None:
    assert expert_map((0, 0, 1, 0, 2, 3), 2, rank).local_logical == local


# ---- ExpertLoad -----------------------------------------------------------------------------


def test_expert_load_record_counts_slots() -> None:
    load = ExpertLoad(num_layers=2, num_slots=4, window_rounds=3, device="cpu")
    load.record(0, torch.tensor([[0, 1], [1, 3]]))
    load.record(1, torch.tensor([2]))
    load.record(1, torch.tensor([[2, 2, 2, 2, 2, 0]]))  # longer than before: the ones grow
    assert load.window().tolist() == [[1, 2, 0, 1], [1, 0, 6, 0]]
    assert load.rounds == 0


@pytest.mark.parametrize(
    ("window_rounds", "tokens", "within"),
    [
        # Tokens per round (round i records tokens[i] to slot 0 of layer 0) and, while each
        # round is being recorded, the window: that round and the window_rounds completed
        # ones before it; older rounds fall out.
        (1, [1, 2, 4], [1, 3, 6]),
        (2, [1, 2, 4, 8], [1, 3, 7, 14]),
        (3, [1, 2, 4, 8, 16], [1, 3, 7, 15, 30]),
        (5, [1, 2, 4], [1, 3, 7]),
    ],
)
def test_expert_load_ring(window_rounds: int, tokens: list[int], within: list[int]) -> None:
    load = ExpertLoad(num_layers=1, num_slots=2, window_rounds=window_rounds, device="cpu")
    for i, (n, expected) in enumerate(zip(tokens, within, strict=True)):
        load.record(0, torch.zeros(n, dtype=torch.long))
        assert load.window().tolist() == [[expected, 0]], i
        load.end_round()
        assert load.rounds == min(i + 1, window_rounds)


def test_expert_load_reset() -> None:
    load = ExpertLoad(num_layers=2, num_slots=3, window_rounds=4, device="cpu")
    for _ in range(3):
        load.record(1, torch.tensor([0, 2, 2]))
        load.end_round()
    load.reset()
    assert load.rounds == 0
    assert load.window().tolist() == [[0, 0, 0], [0, 0, 0]]
    load.record(0, torch.tensor([1]))
    assert load.window().tolist() == [[0, 1, 0], [0, 0, 0]]


def test_expert_load_refuses_an_empty_window() -> None:
    with refuses("--eplb-window-rounds must be >= 1, got 0"):
        ExpertLoad(1, 4, 0, "cpu")


@pytest.mark.parametrize("window_rounds", [1, 2, 4])
def test_expert_load_window_after_end_round_holds_rounds(window_rounds: int) -> None:
    load = ExpertLoad(num_layers=1, num_slots=2, window_rounds=window_rounds, device="cpu")
    for _ in range(window_rounds + 3):  # the ring full, as at a rebalance point
        load.record(0, torch.tensor([0, 1, 1]))
        load.end_round()
    assert load.rounds == window_rounds
    assert load.window().tolist() == [[window_rounds, 2 * window_rounds]]


# ---- placement file -------------------------------------------------------------------------


LOADS = [[6, 2, 2, 2], [1, 1, 1, 1], [0, 9, 0, 1]]


@pytest.mark.parametrize(
    "layout",
    [Layout(4, 6, 2), Layout(4, 4, 2), Layout(4, 8, 4), Layout(8, 12, 4, 2, 4)],
)
def test_placement_file_round_trip(tmp_path: Path, layout: Layout) -> None:
    loads = [random_loads(seed, layout.num_logical) for seed in SEEDS]
    path = tmp_path / "placement.json"
    write_placement_file(path, layout, loads)
    body = json.loads(path.read_text())
    assert body["num_experts"] == layout.num_logical
    assert body["num_redundant_experts"] == layout.num_physical - layout.num_logical
    assert body["dp_size"] == layout.num_ranks
    assert read_placement_file(path, layout, len(loads)) == place(loads, layout)
    assert read_placement_file(str(path), layout, len(loads)) == place(loads, layout)


def test_placement_file_known_content(tmp_path: Path) -> None:
    path = tmp_path / "p.json"
    write_placement_file(path, Layout(4, 6, 2), LOADS[:1])
    assert json.loads(path.read_text()) == {
        "num_experts": 4,
        "num_redundant_experts": 2,
        "dp_size": 2,
        "layers": [[0, 0, 2, 0, 1, 3]],
    }


def _write(path: Path, body: object) -> Path:
    path.write_text(body if isinstance(body, str) else json.dumps(body))
    return path


def _body(layers: list[list[int]], **header: int) -> dict[str, object]:
    return {"num_experts": 4, "num_redundant_experts": 2, "dp_size": 2, **header, "layers": layers}


GOOD = [0, 0, 2, 0, 1, 3]


@pytest.mark.parametrize(
    ("written", "parts"),
    [
        # Written for 8 experts (+2): 10 slots where the group has 6.
        (
            lambda p: write_placement_file(p, Layout(8, 10, 2), [[1] * 8] * 3),
            ["planned for num_experts 8, this deployment has 4"],
        ),
        # Written for 6 experts, no redundancy: 6 slots, but names experts 4 and 5.
        (
            lambda p: write_placement_file(p, Layout(6, 6, 2), [[1] * 6] * 3),
            ["planned for num_experts 6, this deployment has 4"],
        ),
        # Written for dp 4 (8 slots: 4 experts + 4 redundant).
        (
            lambda p: write_placement_file(p, Layout(4, 8, 4), [[1] * 4] * 3),
            ["planned for num_redundant_experts 4, this deployment has 2"],
        ),
        # Written for 3 experts over dp 3: 3 slots.
        (
            lambda p: write_placement_file(p, Layout(3, 3, 3), [[1] * 3] * 3),
            ["planned for num_experts 3, this deployment has 4"],
        ),
        # Wrong number of layers.
        (
            lambda p: write_placement_file(p, Layout(4, 6, 2), LOADS[:2]),
            ["2 layers, the model has 3 MoE layers"],
        ),
        (lambda p: _write(p, _body([GOOD] * 4)), ["4 layers, the model has 3 MoE layers"]),
        # An expert missing in one layer, the layer named.
        (
            lambda p: _write(p, _body([GOOD, GOOD, [0, 0, 1, 1, 2, 2]])),
            ["layer 2: placement leaves expert(s) [3] without a copy"],
        ),
        (
            lambda p: _write(p, _body([GOOD, [0, 1, 2, 3, 9, 0], GOOD])),
            ["layer 1: placement names expert 9"],
        ),
        (lambda p: _write(p, _body([GOOD, GOOD, [0, 1, 2]])), ["layer 2: a placement has 3"]),
        # A hand-written file without the header: its layers are checked all the same.
        (
            lambda p: _write(p, {"layers": [GOOD, GOOD, [0, 1, 2, 3, 0, 1, 2, 3]]}),
            ["layer 2: a placement has 8 slots; this group has 6"],
        ),
        (
            lambda p: _write(p, {"layers": [GOOD, [0, 1, 2, 3, 4, 0], GOOD]}),
            ["layer 1: placement names expert 4", "the model has 4 (0..3)"],
        ),
        # Not JSON at all, JSON of the wrong shape, no file.
        (lambda p: _write(p, "{not json"), ["not JSON"]),
        (lambda p: _write(p, "{'layers': []}"), ["not JSON"]),
        (lambda p: p.write_bytes(b"\xff\xfe\x00garbage"), ["not JSON"]),
        (lambda p: _write(p, "[[0, 0, 2, 0, 1, 3]]"), ["needs a 'layers' list"]),
        (lambda p: _write(p, {"layers": [GOOD, 3, GOOD]}), ["needs a 'layers' list"]),
        (lambda p: _write(p, {"num_experts": 4}), ["needs a 'layers' list"]),
        (lambda p: None, ["No such file"]),
    ],
)
def test_placement_file_refuses(
    tmp_path: Path, written: Callable[[Path], object], parts: list[str]
) -> None:
    path = tmp_path / "placement.json"
    written(path)
    with refuses(FLAG, str(path), *parts):
        read_placement_file(path, Layout(4, 6, 2), 3)


@pytest.mark.parametrize(
    ("written_for", "header"),
    [
        (Layout(4, 6, 3), {"dp_size": 3}),  # packed for 3 ranks of 2 slots, read for 2 of 3
        (Layout(4, 6, 2), {"num_experts": 6, "num_redundant_experts": 0}),  # header edited
    ],
)
def test_placement_file_refuses_a_header_for_another_group(
    tmp_path: Path, written_for: Layout, header: dict[str, int]
) -> None:
    path = tmp_path / "placement.json"
    write_placement_file(path, written_for, LOADS)
    body = json.loads(path.read_text())
    path.write_text(json.dumps({**body, **header}))
    with refuses(FLAG, str(path)):
        read_placement_file(path, Layout(4, 6, 2), 3)


# ---- ExpertPlacement ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("num_experts", "world", "rank", "redundant", "per_rank", "local"),
    [
        (4, 1, 0, 0, 4, range(0, 4)),
        (4, 2, 1, 0, 2, range(2, 4)),
        (4, 2, 0, 2, 3, range(0, 3)),
        (4, 2, 1, 2, 3, range(3, 6)),
        (8, 4, 3, 4, 3, range(9, 12)),
        (256, 8, 5, 32, 36, range(180, 216)),  # DeepSeek-V3's 256 + 32 over 8
        (6, 3, 2, 3, 3, range(6, 9)),
    ],
)
def test_expert_placement_slots(
    num_experts: int, world: int, rank: int, redundant: int, per_rank: int, local: range
) -> None:
    p = ExpertPlacement(num_experts, world, rank, redundant)
    assert p.num_physical_experts == num_experts + redundant
    assert p.num_local_experts == per_rank
    assert p.first_local_expert == local.start
    assert p.local_experts == local
    assert [p.owner_of(s) for s in local] == [rank] * per_rank
    assert [p.owner_of(s) for s in range(p.num_physical_experts)] == [
        r for r in range(world) for _ in range(per_rank)
    ]
    layout = p.layout()
    assert (layout.num_logical, layout.num_physical, layout.num_ranks) == (
        num_experts,
        num_experts + redundant,
        world,
    )
    assert p.layout(num_nodes=1, num_groups=num_experts).num_groups == num_experts


@pytest.mark.parametrize(
    ("args", "parts"),
    [
        (
            (4, 2, 0, 1),
            ["num_experts (4) + --num-redundant-experts (1) divisible by --dp-size (2)"],
        ),
        ((8, 3, 0, 2), ["--num-redundant-experts (2)", "--dp-size (3)"]),
        ((4, 3, 0, 0), ["num_experts (4) divisible by --dp-size (3)"]),
        ((4, 2, 0, -1), ["--num-redundant-experts must be >= 0, got -1"]),
        ((4, 2, 2, 0), ["rank 2 of world 2"]),
        ((4, 0, 0, 0), ["rank 0 of world 0"]),
        ((0, 1, 0, 0), ["0 experts"]),
    ],
)
def test_expert_placement_refuses(args: tuple[int, int, int, int], parts: list[str]) -> None:
    with refuses(*parts):
        ExpertPlacement(*args)


# ---- check_expert_flags, through ServerArgs -------------------------------------------------

# tiny-moe: 4 experts, 4 MoE layers; tiny-llama: dense.
MOE = {"model": "tiny-moe", "device": "cpu"}


@pytest.mark.parametrize(
    ("kwargs", "parts"),
    [
        (
            {"model": "tiny-llama", "enable_eplb": True, "dp_size": 2},
            ["--enable-eplb applies to MoE models; tiny-llama is dense"],
        ),
        (
            {"model": "tiny-llama", "num_redundant_experts": 2, "dp_size": 2},
            ["--num-redundant-experts applies to MoE models"],
        ),
        ({"enable_eplb": True}, ["--enable-eplb", "needs --dp-size > 1 (got 1)"]),
        (
            {"num_redundant_experts": 4, "enable_eplb": True},
            ["--enable-eplb", "--dp-size > 1 (got 1)"],
        ),
        (
            {"num_redundant_experts": 2, "dp_size": 2},
            ["--num-redundant-experts needs --enable-eplb or --expert-placement-file"],
        ),
        (
            {"eplb_window_rounds": 20, "eplb_interval_rounds": 10},
            ["--eplb-window-rounds (20) must be <= --eplb-interval-rounds (10)"],
        ),
        (
            {
                "eplb_window_rounds": 20,
                "eplb_interval_rounds": 10,
                "enable_eplb": True,
                "dp_size": 2,
            },
            ["--eplb-window-rounds (20)", "--eplb-interval-rounds (10)"],
        ),
        (
            {"num_redundant_experts": 1, "enable_eplb": True, "dp_size": 2},
            ["--num-redundant-experts (1) divisible by --dp-size (2)"],
        ),
        ({"enable_eplb": True, "dp_size": 3}, ["num_experts (4) divisible by --dp-size (3)"]),
        ({"num_redundant_experts": -1}, ["--num-redundant-experts must be an integer >= 0"]),
        ({"num_redundant_experts": 1.5}, ["--num-redundant-experts must be an integer >= 0"]),
        ({"num_redundant_experts": True}, ["--num-redundant-experts must be an integer >= 0"]),
    ],
)
def test_server_args_refuse_eplb_flags(kwargs: dict[str, object], parts: list[str]) -> None:
    with refuses(*parts):
        ServerArgs(**{**MOE, **kwargs})


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"enable_eplb": True, "dp_size": 2},
        {"enable_eplb": True, "dp_size": 2, "num_redundant_experts": 2},
        {"enable_eplb": True, "dp_size": 4, "num_redundant_experts": 4},
        {"enable_eplb": True, "dp_size": 2, "eplb_window_rounds": 10, "eplb_interval_rounds": 10},
        {"model": "tiny-llama"},  # dense without EPLB flags
    ],
)
def test_server_args_accept_eplb_flags(kwargs: dict[str, object]) -> None:
    args = ServerArgs(**{**MOE, **kwargs})
    for name, value in kwargs.items():
        assert getattr(args, name) == value


def test_server_args_read_the_placement_file(tmp_path: Path) -> None:
    good = tmp_path / "good.json"
    write_placement_file(good, Layout(4, 6, 2), [*LOADS, [1, 2, 3, 4]])  # 4 MoE layers
    args = ServerArgs(**MOE, dp_size=2, num_redundant_experts=2, expert_placement_file=str(good))
    assert args.expert_placement_file == str(good)
    # The placement file alone (static placement) is enough for the redundant slots.
    short = tmp_path / "short.json"
    write_placement_file(short, Layout(4, 6, 2), LOADS)
    with refuses(FLAG, str(short), "3 layers, the model has 4 MoE layers"):
        ServerArgs(**MOE, dp_size=2, num_redundant_experts=2, expert_placement_file=str(short))
    # The same file without the redundant slots it was planned with: 6 slots for 4.
    with refuses(FLAG, str(good), "planned for num_redundant_experts 2, this deployment has 0"):
        ServerArgs(**MOE, dp_size=2, expert_placement_file=str(good))
    with refuses("--expert-placement-file", "needs --dp-size > 1"):
        ServerArgs(**MOE, expert_placement_file=str(good))


# ---- re-home after a membership change (elastic EP) -----------------------------------------


@pytest.mark.parametrize(
    ("held", "layout", "placement", "transfers", "from_files"),
    [
        # A lone survivor of two that held experts 0 and 1: it keeps them, reads 2 and 3.
        ([[0, 1]], Layout(4, 4, 1), (0, 1, 2, 3), 0, [(2, 0, 2), (3, 0, 3)]),
        # A lone survivor that held every expert (redundant copies): nothing from the files.
        ([[0, 1, 2, 3]], Layout(4, 4, 1), (0, 1, 2, 3), 0, []),
        # ... and held them in another order: each keeps its slot.
        ([[3, 1, 0, 2]], Layout(4, 4, 1), (3, 1, 0, 2), 0, []),
        # A survivor grown to hold all four alone, and an empty joiner, at 2 slots a member:
        # the survivor keeps its first two, the joiner takes the other two from it.
        ([[0, 1, 2, 3], []], Layout(4, 4, 2), (0, 1, 2, 3), 2, []),
        # A joiner that loaded its seat's shard (2, 3) takes the pack it holds: nothing moves.
        ([[0, 1, 2, 3], [2, 3]], Layout(4, 4, 2), (0, 1, 2, 3), 0, []),
        # Members listed the other way round: the match follows the holdings, not the order.
        ([[2, 3], [0, 1, 2, 3]], Layout(4, 4, 2), (2, 3, 0, 1), 0, []),
        # Three members re-formed from four with one copy each, grown to 3 slots a member: the
        # dead one's experts (6, 7) come from the files into the least loaded members, the
        # last spare slot takes a copy of expert 0 from member 0.
        (
            [[0, 1], [2, 3], [4, 5]],
            Layout(8, 9, 3),
            (0, 1, 6, 2, 3, 7, 4, 5, 0),
            1,
            [(6, 0, 2), (7, 1, 2)],
        ),
    ],
)
def test_rehome_layer_tables(
    held: list[list[int]],
    layout: Layout,
    placement: tuple[int, ...] | None,
    transfers: int,
    from_files: list[tuple[int, int, int]] | None,
) -> None:
    plan = rehome_layer(held, layout)
    assert check_placement(plan.placement, layout) == plan.placement
    if placement is not None:
        assert plan.placement == placement
    assert plan.transfers == transfers
    if from_files is not None:
        assert [(d.expert, d.rank, d.slot) for d in plan.loads] == from_files
    # Every slot is filled exactly once, from a member that holds its expert or the files.
    n = layout.slots_per_rank
    filled = [(m.dst_rank, m.dst_slot) for m in plan.moves] + [(d.rank, d.slot) for d in plan.loads]
    assert sorted(filled) == [(r, s) for r in range(layout.num_ranks) for s in range(n)]
    for move in plan.moves:
        assert held[move.src_rank][move.src_slot] == move.expert
        assert plan.placement[move.dst_rank * n + move.dst_slot] == move.expert
    held_anywhere = {e for experts in held for e in experts}
    assert all(d.expert not in held_anywhere for d in plan.loads)
    assert rehome_layer(held, layout) == plan  # deterministic: every member agrees


def test_rehome_layer_reads_from_files_only_what_no_member_holds() -> None:
    plan = rehome_layer([[0, 1], [2, 3], [4, 5]], Layout(8, 9, 3))
    assert sorted(d.expert for d in plan.loads) == [6, 7]


def test_rehome_layer_balances_on_loads() -> None:
    # Expert 0 is hot: the joiner's spare slot copies it first, so each member has one.
    plan = rehome_layer([[0, 1, 2, 3], []], Layout(4, 6, 2), loads=[10, 1, 1, 1])
    assert copies_of(plan.placement, 4)[0] == 2
    assert plan.placement[:3].count(0) == 1 and plan.placement[3:].count(0) == 1


@pytest.mark.parametrize(
    ("num_logical", "slots_per_rank", "num_ranks", "physical"),
    [
        (4, 2, 2, 4),  # full size: the configured layout
        (4, 2, 1, 4),  # a lone survivor grows to hold every expert
        (4, 4, 1, 4),  # redundant slots: already enough
        (8, 3, 3, 9),  # 3 of 4 members keep 3 slots each
        (8, 2, 3, 9),  # 2 a member is too few for 8 over 3: grown to 3
        (256, 36, 7, 252 + 7),  # DeepSeek-V3 +32 over 8, one rank lost: 37 a member
    ],
)
def test_grown_layout(num_logical: int, slots_per_rank: int, num_ranks: int, physical: int):
    layout = grown_layout(num_logical, slots_per_rank, num_ranks)
    assert layout.num_physical == physical
    assert layout.num_physical >= num_logical


# ---- match_ranks: a re-placement's packs onto the ranks that hold them -----------------------


@pytest.mark.parametrize(
    ("old", "new", "num_ranks", "per_node", "matched"),
    [
        # The same packs, swapped between the ranks: given back, nothing moves.
        ((0, 1, 2, 3), (2, 3, 0, 1), 2, None, (0, 1, 2, 3)),
        # One expert changes: only it moves.
        ((0, 1, 2, 3), (2, 3, 0, 3), 2, None, (0, 3, 2, 3)),
        # Nothing shared: the packs stay in order.
        ((0, 1, 2, 3, 4, 5), (0, 1, 2, 3, 4, 5), 3, None, (0, 1, 2, 3, 4, 5)),
        ((0, 1, 2, 3, 4, 5), (4, 5, 0, 1, 2, 3), 3, None, (0, 1, 2, 3, 4, 5)),
        # Nodes of two ranks: packs are swapped within a node, never across.
        ((0, 1, 2, 3, 4, 5, 6, 7), (2, 3, 0, 1, 6, 7, 4, 5), 4, 2, (0, 1, 2, 3, 4, 5, 6, 7)),
        ((0, 1, 2, 3, 4, 5, 6, 7), (4, 5, 6, 7, 0, 1, 2, 3), 4, 2, (4, 5, 6, 7, 0, 1, 2, 3)),
    ],
)
def test_match_ranks(old, new, num_ranks, per_node, matched) -> None:
    got = match_ranks(old, new, num_ranks, per_node)
    assert got == matched
    # A permutation of the packs: the same balance for any loads.
    loads = [float(3 * e + 1) for e in range(max(new) + 1)]
    assert sorted(rank_loads(got, loads, num_ranks)) == sorted(rank_loads(new, loads, num_ranks))


def test_steady_loads_move_nothing() -> None:
    """Two windows of nearly the same loads: greedy packing interleaves the experts anew, but
    the rebalance keeps the placement it has (the gain is noise), so nothing moves."""
    layout = Layout(16, 16, 2)
    first = [100.0 - 5 * e for e in range(16)]
    second = [x + (0.4 if e % 3 == 0 else -0.3) for e, x in enumerate(first)]
    old = place_layer(first, layout)
    assert place_layer(second, layout) != old  # the packing did change
    assert replace_layer(old, second, layout) == old


@pytest.mark.parametrize(
    ("old", "loads", "replaced"),
    [
        # Everything on rank 0's experts: re-placed, the hot pair split over the ranks.
        ((0, 1, 2, 3), [10.0, 10.0, 0.0, 0.0], (0, 2, 1, 3)),
        # Already even: kept.
        ((0, 1, 2, 3), [5.0, 5.0, 5.0, 5.0], (0, 1, 2, 3)),
        # A gain of 0.01 (< MIN_GAIN): kept.
        ((0, 1, 2, 3), [1.0, 1.02, 1.0, 1.0], (0, 1, 2, 3)),
    ],
)
def test_replace_layer(old, loads, replaced) -> None:
    assert replace_layer(old, loads, Layout(4, 4, 2)) == replaced
    assert MIN_GAIN == 0.02


# ---- roundgate eplb-plan ----------------------------------------------------------------------


def test_eplb_plan_writes_a_placement_file_the_deployment_accepts(tmp_path: Path, capsys) -> None:
    from roundgate.cli.main import main as roundgate
    from roundgate.kernels.moe.placement_file import write_loads_file

    loads = tmp_path / "loads.json"
    write_loads_file(loads, 100, [[100, 90, 5, 5, 5, 5, 5, 5], [10, 10, 10, 10, 10, 10, 10, 80]])
    out = tmp_path / "placement.json"
    argv = ["eplb-plan", str(loads), "-o", str(out), "--dp-size", "2"]
    assert roundgate([*argv, "--num-redundant-experts", "2"]) == 0
    placements = read_placement_file(out, Layout(8, 10, 2), 2)
    # Layer 0's two hot experts get second copies, one on each rank.
    assert copies_of(placements[0], 8)[:2] == [2, 2]
    table = capsys.readouterr().out
    assert "| 0 | 0.550 | 1.000 |" in table


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--num-nodes", "3"], "--num-nodes 3 does not divide --dp-size 4"),
        (["--num-groups", "3"], "--num-groups 3 does not divide the 8 experts"),
        (["--num-redundant-experts", "-1"], "--num-redundant-experts must be >= 0"),
    ],
)
def test_eplb_plan_refusals_name_the_flag(tmp_path: Path, capsys, extra, message) -> None:
    from roundgate.cli.main import main as roundgate
    from roundgate.kernels.moe.placement_file import write_loads_file

    loads = tmp_path / "loads.json"
    write_loads_file(loads, 10, [[1.0] * 8])
    with pytest.raises(SystemExit):
        roundgate(
            ["eplb-plan", str(loads), "-o", str(tmp_path / "p.json"), "--dp-size", "4", *extra]
        )
    assert message in capsys.readouterr().err
