"""The cache-aware routing policy as a table: prefixes routed earlier, loads, and the choice."""

from __future__ import annotations

import pytest

from roundgate.routing.cache_aware import CacheAwareConfig, CacheAwarePolicy, PrefixIndex

P = 4  # page size
A, B, C = [1] * 8, [2] * 8, [3] * 8  # two pages each
RANKS = ("r0", "r1", "r2")


def policy(**config) -> CacheAwarePolicy:
    return CacheAwarePolicy(CacheAwareConfig(page_size=P, **config))


# Each case: earlier (rank -> prompt) routes to seed the index, then one prompt with loads.
CASES = [
    ("nothing cached: least loaded", {}, [], A, (2, 0, 1), ("r1", "least-loaded", 0)),
    ("the rank holding the prefix", {}, [("r2", A)], A + B, (0, 0, 0), ("r2", "cache", 8)),
    (
        "longest match wins",
        {},
        [("r0", A), ("r1", A + B)],
        A + B + C,
        (0, 3, 0),
        ("r1", "cache", 16),
    ),
    (
        "a partial page never matches",
        {},
        [("r0", [*A, 5, 5])],
        [*A, 5, 5, 5, 5],
        (0, 0, 0),
        ("r0", "cache", 8),
    ),
    (
        "equal matches: the less loaded",
        {},
        [("r0", A), ("r2", A)],
        A + C,
        (3, 0, 1),
        ("r2", "cache", 8),
    ),
    (
        "equal matches and loads: the earlier",
        {},
        [("r0", A), ("r2", A)],
        A,
        (1, 0, 1),
        ("r0", "cache", 8),
    ),
    (
        "overloaded past both thresholds: least loaded",
        {"balance_abs_threshold": 4, "balance_rel_threshold": 1.5},
        [("r1", A)],
        A,
        (0, 10, 2),
        ("r0", "balance", 0),
    ),
    (
        "within the absolute threshold",
        {"balance_abs_threshold": 4, "balance_rel_threshold": 1.5},
        [("r1", A)],
        A,
        (0, 4, 2),
        ("r1", "cache", 8),
    ),
    (
        "within the relative threshold",
        {"balance_abs_threshold": 4, "balance_rel_threshold": 1.5},
        [("r1", A)],
        A,
        (40, 50, 41),
        ("r1", "cache", 8),
    ),
    (
        "no match is least loaded, not balance",
        {"balance_abs_threshold": 0},
        [("r1", A)],
        B,
        (5, 0, 9),
        ("r1", "least-loaded", 0),
    ),
]


@pytest.mark.parametrize(
    ("config", "seeded", "prompt", "loads", "expected"),
    [case[1:] for case in CASES],
    ids=[case[0] for case in CASES],
)
def test_choices(config, seeded, prompt, loads, expected) -> None:
    p = policy(**config)
    for rank, earlier in seeded:
        p.index.insert(rank, p_keys(earlier))
    choice = p.choose(RANKS, loads, prompt)
    assert (choice.rank, choice.reason, choice.matched_tokens) == expected


def p_keys(tokens):
    from roundgate.actors.control.page_keys import page_keys

    return page_keys(tokens, P)


def test_a_choice_is_remembered_so_the_next_turn_follows_it() -> None:
    p = policy()
    first = p.choose(RANKS, (1, 0, 1), A)
    assert (first.rank, first.reason) == ("r1", "least-loaded")
    # The second turn extends the first; r1 is now busier but under the thresholds.
    assert p.choose(RANKS, (0, 3, 0), A + B).rank == "r1"


def test_a_restarted_rank_stops_attracting_its_old_prefixes() -> None:
    p = policy()
    p.index.insert("r1", p_keys(A))
    # r1's replica was replaced: it comes back under a new id, with an empty cache.
    choice = p.choose(("r0", "r1-new", "r2"), (1, 0, 2), A)
    assert (choice.rank, choice.reason) == ("r1-new", "least-loaded")
    assert p.index.num_pages("r1") == 0
    # ... and the old id, should it return, holds nothing either.
    assert p.choose(("r0", "r1", "r2"), (0, 0, 0), B + C).reason == "least-loaded"


@pytest.mark.parametrize(
    ("affinity", "loads", "expected"),
    [
        (True, (0, 0, 0), ("r2", "session")),
        (True, (0, 0, 40), ("r0", "balance")),  # affinity yields to the load threshold too
        (False, (1, 0, 1), ("r1", "least-loaded")),
    ],
)
def test_session_affinity_follows_the_sessions_last_rank(affinity, loads, expected) -> None:
    p = policy(session_affinity=affinity)
    assert p.choose(RANKS, (1, 1, 0), A, session="s1").rank == "r2"
    choice = p.choose(RANKS, loads, B, session="s1")  # no shared prefix with turn one
    assert (choice.rank, choice.reason) == expected


def test_the_index_forgets_tails_first_beyond_the_rank_pool() -> None:
    index = PrefixIndex(max_pages_per_rank=3)
    index.insert("r0", p_keys(A + B))  # four pages, room for three: the tail page goes
    assert index.num_pages("r0") == 3
    assert index.match("r0", p_keys(A + B)) == 3


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("page_size", 0),
        ("max_pages_per_rank", 0),
        ("balance_abs_threshold", -1),
        ("balance_rel_threshold", 0.5),
    ],
)
def test_bad_config_names_the_field(field, value) -> None:
    with pytest.raises(ValueError, match=field):
        CacheAwareConfig(**{field: value})


def test_loads_must_match_ranks() -> None:
    with pytest.raises(ValueError, match="one load per rank"):
        policy().choose(RANKS, (0, 0), A)
