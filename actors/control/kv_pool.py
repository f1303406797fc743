"""KV-cache page bookkeeping for one rank (no tensors: those live in the model runner).

With prefix caching, a full page whose K/V are computed may carry a content key
(``roundgate.actors.control.page_keys``) and be shared by every request whose prefix has that key::

    free ──take──► referenced (refs >= 1) ──last holder lets go──► evictable (keyed, LRU)
      ▲                 ▲    (no key)  │                              │   │
      └─────────────────┼──────────────┘          a prompt reuses it ─┘   │
                        └────────── its slot is needed: key dropped ◄─────┘

Evictable pages still hold valid K/V, so they count as available (``num_free_pages``) and a
new allocation takes one only when no plain free page is left, least recently used first.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, KeysView, Sequence

from roundgate.actors.control.config import PoolConfig
from roundgate.actors.control.kv_events import KvEventLog
from roundgate.actors.control.page_keys import PageKey, num_leading


class KVPool:
    """A fixed number of pages of ``page_size`` tokens, each held by zero or more requests.

    Invariant (``check_integrity``): every page is exactly one of free, evictable (cached,
    no holder) or referenced, and a referenced page's count equals the owners holding it.
    Requests that do not fit get ``None``; the pool never hands out more pages than it has.
    """

    def __init__(self, config: PoolConfig) -> None:
        self.config = config
        self.num_pages = num_pages = config.num_pages
        self.page_size = config.page_size
        # Low page ids are handed out first (pop from the end of a reversed list).
        self._free: list[int] = list(range(num_pages - 1, -1, -1))
        self._owned: dict[Hashable, list[int]] = {}
        self._refs: list[int] = [0] * num_pages
        # Keyed pages no one holds, least recently released first.
        self._evictable: OrderedDict[int, None] = OrderedDict()
        self._key_of: dict[int, PageKey] = {}
        self._page_of: dict[PageKey, int] = {}
        self.num_evictions = 0
        # Stored/removed keys for the routers (``roundgate.actors.control.kv_events``); None: not
        # kept.
        self.events: KvEventLog | None = None

    @property
    def num_free_pages(self) -> int:
        """Pages an allocation may take: plain free ones plus evictable cached ones."""
        return len(self._free) + len(self._evictable)

    @property
    def num_used_pages(self) -> int:
        """Pages some request holds (cached pages with no holder are not in use)."""
        return self.num_pages - self.num_free_pages

    @property
    def num_cached_pages(self) -> int:
        """Pages a new prompt could reuse (keyed), held or not."""
        return len(self._key_of)

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
        return self.pages_for(num_tokens) - len(self.pages_of(owner)) <= self.num_free_pages

    def allocate(self, owner: Hashable, num_tokens: int) -> list[int] | None:
        """Give a new owner pages for ``num_tokens`` tokens; ``None`` if they do not fit."""
        if owner in self._owned:
            raise ValueError(f"KV owner {owner!r} already holds pages")
        if self.pages_for(num_tokens) > self.num_free_pages:
            return None
        self._owned[owner] = []
        return self.extend(owner, num_tokens)

    def extend(self, owner: Hashable, num_tokens: int) -> list[int] | None:
        """Grow ``owner`` to hold ``num_tokens`` tokens; returns the newly granted pages."""
        # Look up without registering: a refused extend must leave the pool unchanged (an
        # owner left behind with no pages would make a later allocate() refuse it).
        pages = self._owned.get(owner, [])
        need = self.pages_for(num_tokens) - len(pages)
        if need > self.num_free_pages:
            return None
        pages = self._owned.setdefault(owner, pages)
        if need <= 0:
            return []
        granted = [self._take() for _ in range(need)]
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

    def truncate(self, owner: Hashable, num_tokens: int) -> int:
        """Give back ``owner``'s pages past those ``num_tokens`` tokens need (a verification
        that rejected drafts written into them); returns how many. Only the owner's own
        unkeyed tail can go: a page holding a rejected draft's K/V was never keyed."""
        pages = self._owned.get(owner)
        if pages is None:
            return 0
        keep = self.pages_for(num_tokens)
        refs = self._refs
        dropped = 0
        while len(pages) > keep:
            page = pages[-1]
            if refs[page] != 1 or page in self._key_of:
                break  # shared or keyed: it holds real tokens; leave it
            pages.pop()
            refs[page] = 0
            self._free.append(page)
            dropped += 1
        return dropped

    def free(self, owner: Hashable) -> int:
        """Let go of all of ``owner``'s pages; returns how many it held.

        A page nobody else holds becomes free, or evictable if it is keyed. Pages are released
        last-first, so a sequence's tail (the part least likely shared) is evicted first.
        """
        pages = self._owned.pop(owner, [])
        refs = self._refs
        for page in reversed(pages):
            refs[page] -= 1
            if refs[page] == 0:
                if page in self._key_of:
                    self._evictable[page] = None
                else:
                    self._free.append(page)
        return len(pages)

    # ---- prefix caching --------------------------------------------------------------------

    def num_cached_prefix(self, keys: Sequence[PageKey]) -> int:
        """How many leading pages of ``keys`` are cached (a read: nothing changes)."""
        return num_leading(keys, self._page_of)

    def allocate_cached(self, owner: Hashable, keys: Sequence[PageKey]) -> list[int]:
        """Start a new owner on the cached pages of the longest prefix of ``keys``.

        Returns those pages (possibly none); each gains a reference, and an evictable one
        stops being evictable.
        """
        if owner in self._owned:
            raise ValueError(f"KV owner {owner!r} already holds pages")
        pages: list[int] = []
        for key in keys:
            page = self._page_of.get(key)
            if page is None:
                break
            if self._refs[page] == 0:
                del self._evictable[page]
            self._refs[page] += 1
            pages.append(page)
        self._owned[owner] = pages
        return pages

    def share(self, owner: Hashable, pages: Sequence[int]) -> None:
        """Start a new owner on pages others hold (each gains a reference): a fork's common
        prompt on a decode rank, read by every sequence and written by none."""
        if owner in self._owned:
            raise ValueError(f"KV owner {owner!r} already holds pages")
        for page in pages:
            if self._refs[page] == 0:
                raise ValueError(f"page {page} is not held: only a held page is shared")
        for page in pages:
            self._refs[page] += 1
        self._owned[owner] = list(pages)

    def num_holders(self, page: int) -> int:
        """How many requests hold ``page`` (its reference count)."""
        return self._refs[page]

    def cached_page(self, key: PageKey) -> int | None:
        """The page holding ``key``'s content, if cached."""
        return self._page_of.get(key)

    def register(self, page: int, key: PageKey) -> bool:
        """Key a held page whose K/V are now computed; False when the page already has a key
        or another page already caches that content (the first copy stays the cached one)."""
        if self._refs[page] == 0:
            raise ValueError(f"page {page} is not held: only a held, computed page is keyed")
        if page in self._key_of or key in self._page_of:
            return False
        self._key_of[page] = key
        self._page_of[key] = page
        if self.events is not None:
            self.events.stored(key)
        return True

    def cached_keys(self) -> KeysView[PageKey]:
        """Every key the pool holds (a live view: copy it to keep it)."""
        return self._page_of.keys()

    def _take(self) -> int:
        """One page for a new holder: a plain free page, else the least recently used
        evictable one (whose key is dropped: its slot is about to be overwritten)."""
        if self._free:
            page = self._free.pop()
        else:
            page, _ = self._evictable.popitem(last=False)
            key = self._key_of.pop(page)
            del self._page_of[key]
            self.num_evictions += 1
            if self.events is not None:
                self.events.removed(key)
        self._refs[page] = 1
        return page

    # ---- checks ----------------------------------------------------------------------------

    def check_integrity(self) -> None:
        """Raise ``AssertionError`` if a page is lost, duplicated, miscounted or out of range."""
        held = [0] * self.num_pages
        for owner, pages in self._owned.items():
            if len(set(pages)) != len(pages):
                raise AssertionError(f"owner {owner!r} holds a page twice")
            for page in pages:
                if not 0 <= page < self.num_pages:
                    raise AssertionError(f"page id {page} out of range")
                held[page] += 1
        if held != self._refs:
            bad = next(p for p in range(self.num_pages) if held[p] != self._refs[p])
            raise AssertionError(
                f"page {bad} owned twice or refcount wrong: {held[bad]} holders, "
                f"refcount {self._refs[bad]}"
            )
        free = set(self._free)
        if len(free) != len(self._free):
            raise AssertionError("a page appears twice in the free list")
        if any(not 0 <= p < self.num_pages for p in free):
            raise AssertionError("page id out of range")
        used = {p for p in range(self.num_pages) if held[p]}
        idle = free | set(self._evictable)
        if used & idle:
            raise AssertionError(f"pages both free and owned: {sorted(used & idle)[:8]}")
        if free & set(self._evictable):
            raise AssertionError("a page is both free and evictable")
        if len(used) + len(idle) != self.num_pages:
            raise AssertionError(
                f"free ({len(idle)}) + used ({len(used)}) != total ({self.num_pages})"
            )
        if any(p not in self._key_of for p in self._evictable) or free & set(self._key_of):
            raise AssertionError("an evictable page without a key, or a free page with one")
        if any(self._page_of.get(k) != p for p, k in self._key_of.items()) or len(
            self._page_of
        ) != len(self._key_of):
            raise AssertionError("page keys and their index disagree")
