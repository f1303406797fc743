"""KV-cache page bookkeeping for one rank (no tensors: those live in the model runner)."""

from __future__ import annotations

from collections.abc import Hashable


class KVPool:
    """A fixed number of pages of ``page_size`` tokens, each owned by at most one request.

    Invariant (``check_integrity``): every page is either free or owned by exactly one owner,
    and free + used == total. Requests that do not fit get ``None``; the pool never hands out
    more pages than it has.
    """

    def __init__(self, num_pages: int, page_size: int) -> None:
        if num_pages < 1 or page_size < 1:
            raise ValueError(
                f"KVPool needs num_pages >= 1 and page_size >= 1, got {num_pages}, {page_size}"
            )
        self.num_pages = num_pages
        self.page_size = page_size
        # Low page ids are handed out first (pop from the end of a reversed list).
        self._free: list[int] = list(range(num_pages - 1, -1, -1))
        self._owned: dict[Hashable, list[int]] = {}

    @property
    def num_free_pages(self) -> int:
        return len(self._free)

    @property
    def num_used_pages(self) -> int:
        return self.num_pages - len(self._free)

    @property
    def occupancy(self) -> float:
        """Fraction of pages in use, 0..1."""
        return self.num_used_pages / self.num_pages

    def pages_for(self, num_tokens: int) -> int:
        """Pages needed to hold ``num_tokens`` tokens."""
        return -(-num_tokens // self.page_size)

    def pages_of(self, owner: Hashable) -> list[int]:
        """The owner's page table (the live list; do not mutate)."""
        return self._owned.get(owner, [])

    def can_fit(self, owner: Hashable, num_tokens: int) -> bool:
        """Whether growing ``owner`` to ``num_tokens`` tokens fits in the free pages."""
        return self.pages_for(num_tokens) - len(self.pages_of(owner)) <= len(self._free)

    def allocate(self, owner: Hashable, num_tokens: int) -> list[int] | None:
        """Give a new owner pages for ``num_tokens`` tokens; ``None`` if they do not fit."""
        if owner in self._owned:
            raise ValueError(f"KV owner {owner!r} already holds pages")
        if self.pages_for(num_tokens) > len(self._free):
            return None
        self._owned[owner] = []
        return self.extend(owner, num_tokens)

    def extend(self, owner: Hashable, num_tokens: int) -> list[int] | None:
        """Grow ``owner`` to hold ``num_tokens`` tokens; returns the newly granted pages."""
        # Look up without registering: a refused extend must leave the pool unchanged (an
        # owner left behind with no pages would make a later allocate() refuse it).
        pages = self._owned.get(owner, [])
        need = self.pages_for(num_tokens) - len(pages)
        if need > len(self._free):
            return None
        pages = self._owned.setdefault(owner, pages)
        if need <= 0:
            return []
        granted = [self._free.pop() for _ in range(need)]
        pages.extend(granted)
        return granted

    def grow(self, owner: Hashable, num_tokens: int) -> bool:
        """``can_fit`` and ``extend`` in one call: grow ``owner`` if it fits, else False.

        The decode path calls this for every running request every round; most calls need no
        new page, so that case returns after one lookup.
        """
        pages = self._owned.get(owner)
        if pages is not None and num_tokens <= len(pages) * self.page_size:
            return True
        return self.extend(owner, num_tokens) is not None

    def free(self, owner: Hashable) -> int:
        """Return all of ``owner``'s pages; returns how many were freed."""
        pages = self._owned.pop(owner, [])
        self._free.extend(reversed(pages))
        return len(pages)

    def check_integrity(self) -> None:
        """Raise ``AssertionError`` if a page is lost, duplicated or out of range."""
        seen: set[int] = set()
        for owner, pages in self._owned.items():
            for page in pages:
                if page in seen:
                    raise AssertionError(f"page {page} owned twice (second owner {owner!r})")
                seen.add(page)
        free = set(self._free)
        if len(free) != len(self._free):
            raise AssertionError("a page appears twice in the free list")
        if seen & free:
            raise AssertionError(f"pages both free and owned: {sorted(seen & free)[:8]}")
        if len(seen) + len(free) != self.num_pages:
            raise AssertionError(
                f"free ({len(free)}) + used ({len(seen)}) != total ({self.num_pages})"
            )
        if any(not 0 <= p < self.num_pages for p in seen | free):
            raise AssertionError("page id out of range")
