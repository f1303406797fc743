"""Content keys of full KV pages: a hash chain over token ids (vLLM v1's block hashes).

Page ``i`` of a sequence is keyed by a digest of page ``i - 1``'s key and page ``i``'s own
token ids, so equal keys mean equal prefixes up to and including that page, not just equal
pages. Only full pages have a key: a partial page can still change. The digest is a 128-bit
BLAKE2b, so two different prefixes sharing a key is not a practical concern (Python's own
``hash`` is 64-bit and easy to collide on purpose). The same function serves the rank's pool
and the router's approximate per-rank prefix index, so both agree on what a prefix is.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Callable, Container, Sequence

PageKey = bytes
# The parent of a sequence's first page.
ROOT_KEY: PageKey = b""
# Packers of n native int64 values, by n (in practice one: the page size). The bytes are
# ``array("q", ids).tobytes()``'s, built without the array (a key per decoded page is on the
# simulator's hot path: benchmarks/bench_simulator.py measures it).
_PACKERS: dict[int, struct.Struct] = {}


def page_key(parent: PageKey, token_ids: Sequence[int]) -> PageKey:
    """The key of a full page holding ``token_ids`` after the prefix keyed ``parent``."""
    packer = _PACKERS.get(len(token_ids))
    if packer is None:
        packer = _PACKERS[len(token_ids)] = struct.Struct(f"={len(token_ids)}q")
    digest = hashlib.blake2b(parent, digest_size=16)
    digest.update(packer.pack(*token_ids))
    return digest.digest()


def page_keys(token_ids: Sequence[int], page_size: int, limit: int | None = None) -> list[PageKey]:
    """Keys of the full pages of ``token_ids`` (at most ``limit`` of them)."""
    keys: list[PageKey] = []
    extend_keys(keys, lambda a, b: token_ids[a:b], len(token_ids), page_size, limit)
    return keys


def extend_keys(
    keys: list[PageKey],
    tokens: Callable[[int, int], Sequence[int]],
    num_tokens: int,
    page_size: int,
    limit: int | None = None,
) -> list[PageKey]:
    """Append to ``keys`` the keys of the full pages of the first ``num_tokens`` tokens that
    it lacks (``tokens(start, stop)`` reads a slice); returns ``keys``."""
    full = num_tokens // page_size
    if limit is not None:
        full = min(full, limit)
    parent = keys[-1] if keys else ROOT_KEY
    for i in range(len(keys), full):
        parent = page_key(parent, tokens(i * page_size, (i + 1) * page_size))
        keys.append(parent)
    return keys


def num_leading(keys: Sequence[PageKey], held: Container[PageKey]) -> int:
    """How many leading pages of ``keys`` are in ``held`` (a prefix match stops at the first
    page missing: the pages after it were computed over it)."""
    count = 0
    for key in keys:
        if key not in held:
            break
        count += 1
    return count
