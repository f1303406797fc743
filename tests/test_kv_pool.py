"""KVPool: page bookkeeping, ``None`` for what does not fit, occupancy, integrity checks."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from roundgate.actors.control.config import PoolConfig
from roundgate.actors.control.kv_pool import KVPool


def make_pool(num_pages: int = 8, page_size: int = 4) -> KVPool:
    return KVPool(PoolConfig(num_pages, page_size))


# --- construction and arithmetic --------------------------------------------------------------


@pytest.mark.parametrize(
    ("num_pages", "page_size", "flag"),
    [
        (0, 4, "--num-kv-pages"),
        (4, 0, "--page-size"),
        (-1, 4, "--num-kv-pages"),
        (4, -2, "--page-size"),
    ],
)
def test_refuses_empty_geometry(num_pages: int, page_size: int, flag: str) -> None:
    with pytest.raises(ValueError, match=f"{flag} must be >= 1"):
        PoolConfig(num_pages, page_size)


@pytest.mark.parametrize(
    ("num_tokens", "pages"), [(0, 0), (1, 1), (3, 1), (4, 1), (5, 2), (8, 2), (9, 3)]
)
def test_pages_for_rounds_up(num_tokens: int, pages: int) -> None:
    assert make_pool(page_size=4).pages_for(num_tokens) == pages


def test_fresh_pool_is_empty_and_consistent() -> None:
    pool = make_pool(8, 4)
    assert (pool.num_free_pages, pool.num_used_pages, pool.occupancy) == (8, 0, 0.0)
    assert pool.pages_of("nobody") == []
    pool.check_integrity()


# --- allocate / extend / free -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("num_tokens", "granted", "occupancy"),
    [
        (0, 0, 0.0),  # an owner with no pages yet (a prompt admitted before its first chunk)
        (1, 1, 0.125),
        (4, 1, 0.125),
        (5, 2, 0.25),
        (32, 8, 1.0),  # exactly the whole pool
    ],
)
def test_allocate_grants_pages_for_tokens(num_tokens: int, granted: int, occupancy: float) -> None:
    pool = make_pool(8, 4)
    pages = pool.allocate("a", num_tokens)
    assert pages is not None and len(pages) == granted
    assert pool.pages_of("a") == pages
    assert pool.occupancy == occupancy
    pool.check_integrity()


def test_allocate_none_when_it_does_not_fit_and_changes_nothing() -> None:
    pool = make_pool(8, 4)
    assert pool.allocate("a", 20) is not None  # 5 pages
    assert pool.allocate("b", 13) is None  # needs 4, 3 free
    assert pool.pages_of("b") == []
    assert pool.num_used_pages == 5
    # The refused owner is not registered: it can still be allocated once it fits.
    assert pool.allocate("b", 12) is not None
    pool.check_integrity()


def test_allocate_twice_for_one_owner_is_an_error() -> None:
    pool = make_pool()
    pool.allocate("a", 1)
    with pytest.raises(ValueError, match="already holds pages"):
        pool.allocate("a", 1)


@pytest.mark.parametrize(
    ("start", "grow_to", "new_pages"),
    [
        (4, 4, 0),  # same size: nothing new
        (4, 2, 0),  # shrinking never frees (free() does that)
        (3, 4, 0),  # still inside the last page
        (4, 5, 1),  # crosses a page boundary
        (1, 16, 3),
    ],
)
def test_extend_returns_only_new_pages(start: int, grow_to: int, new_pages: int) -> None:
    pool = make_pool(8, 4)
    first = pool.allocate("a", start)
    assert first is not None
    granted = pool.extend("a", grow_to)
    assert granted is not None and len(granted) == new_pages
    assert pool.pages_of("a") == first + granted
    pool.check_integrity()


def test_extend_none_when_it_does_not_fit_and_keeps_the_old_pages() -> None:
    pool = make_pool(4, 4)
    pool.allocate("a", 8)
    pool.allocate("b", 4)
    before = list(pool.pages_of("a"))
    assert pool.extend("a", 13) is None  # needs 2 more, 1 free
    assert pool.pages_of("a") == before
    assert pool.num_free_pages == 1
    pool.check_integrity()


def test_failed_extend_of_an_unknown_owner_leaves_no_trace() -> None:
    pool = make_pool(2, 4)
    assert pool.extend("ghost", 100) is None
    # A refused request must not leave the owner half-registered.
    assert pool.allocate("ghost", 4) is not None
    pool.check_integrity()


def test_free_returns_pages_and_counts_them() -> None:
    pool = make_pool(8, 4)
    pool.allocate("a", 12)
    pool.allocate("b", 4)
    assert pool.free("a") == 3
    assert pool.pages_of("a") == []
    assert (pool.num_used_pages, pool.num_free_pages) == (1, 7)
    assert pool.free("a") == 0  # freeing twice is harmless
    assert pool.free("never-seen") == 0
    pool.check_integrity()


def test_freed_pages_are_reused() -> None:
    pool = make_pool(2, 4)
    pool.allocate("a", 8)
    assert pool.allocate("b", 1) is None
    pool.free("a")
    assert sorted(pool.allocate("b", 8) or []) == [0, 1]
    pool.check_integrity()


@pytest.mark.parametrize(
    ("owned_tokens", "grow_to", "fits"),
    [(0, 32, True), (0, 33, False), (8, 32, True), (8, 33, False), (31, 32, True)],
)
def test_can_fit_counts_the_owners_own_pages(owned_tokens: int, grow_to: int, fits: bool) -> None:
    pool = make_pool(8, 4)
    pool.allocate("a", owned_tokens)
    assert pool.can_fit("a", grow_to) is fits


# --- integrity ---------------------------------------------------------------------------------


def _owned_twice(pool: KVPool) -> None:
    pool._owned["b"].append(pool._owned["a"][0])


def _lost_page(pool: KVPool) -> None:
    pool._free.pop()


def _free_and_owned(pool: KVPool) -> None:
    pool._free.append(pool._owned["a"][0])


def _duplicate_free(pool: KVPool) -> None:
    pool._free.append(pool._free[0])


def _out_of_range(pool: KVPool) -> None:
    pool._free[0] = pool.num_pages + 3


@pytest.mark.parametrize(
    ("corrupt", "message"),
    [
        (_owned_twice, "owned twice"),
        (_lost_page, r"free \(\d+\) \+ used \(\d+\) != total"),
        (_free_and_owned, "both free and owned|appears twice|!= total"),
        (_duplicate_free, "appears twice"),
        (_out_of_range, "out of range"),
    ],
)
def test_check_integrity_catches_corruption(corrupt, message: str) -> None:
    pool = make_pool(8, 4)
    pool.allocate("a", 8)
    pool.allocate("b", 4)
    pool.check_integrity()
    corrupt(pool)
    with pytest.raises(AssertionError, match=message):
        pool.check_integrity()


# --- random operation sequences -----------------------------------------------------------------

OPS = st.lists(
    st.tuples(
        st.sampled_from(["allocate", "extend", "free"]), st.integers(0, 5), st.integers(0, 40)
    ),
    max_size=60,
)


@settings(max_examples=100, deadline=None)
@given(ops=OPS, num_pages=st.integers(1, 12), page_size=st.integers(1, 5))
def test_random_operations_never_over_allocate(ops, num_pages: int, page_size: int) -> None:
    """Whatever the sequence, the pool stays consistent and grants exactly what fits."""
    pool = KVPool(PoolConfig(num_pages, page_size))
    tokens: dict[int, int] = {}  # model: owner -> tokens its pages must cover
    for op, owner, num_tokens in ops:
        free_before = pool.num_free_pages
        if op == "allocate":
            if owner in tokens:
                with pytest.raises(ValueError):
                    pool.allocate(owner, num_tokens)
                continue
            pages = pool.allocate(owner, num_tokens)
            if pool.pages_for(num_tokens) > free_before:
                assert pages is None and pool.num_free_pages == free_before
            else:
                assert pages is not None and len(pages) == pool.pages_for(num_tokens)
                tokens[owner] = num_tokens
        elif op == "extend" and owner in tokens:
            need = max(0, pool.pages_for(num_tokens) - pool.pages_for(tokens[owner]))
            granted = pool.extend(owner, num_tokens)
            if need > free_before:
                assert granted is None and pool.num_free_pages == free_before
            else:
                assert granted is not None and len(granted) == need
                tokens[owner] = max(tokens[owner], num_tokens)
        elif op == "free":
            freed = pool.free(owner)
            expected = pool.pages_for(tokens.pop(owner)) if owner in tokens else 0
            assert freed == expected
        pool.check_integrity()
        assert 0 <= pool.num_used_pages <= num_pages
        assert pool.num_used_pages == sum(pool.pages_for(t) for t in tokens.values())
        assert pool.occupancy == pytest.approx(pool.num_used_pages / num_pages)
        for owner_id, owned in tokens.items():
            assert len(pool.pages_of(owner_id)) == pool.pages_for(owned)
