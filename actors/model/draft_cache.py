"""The draft model's own K/V: one dense row per request, outside the paged KV pool.

A draft model runs a forward of its own each round, over tokens the target's pool never
sees (its drafts), so its K/V cannot live in the target's pages. It keeps them here instead::

    k, v   [layers, rows, kv_heads, length, head_dim]   one row per cached request
    row    request id -> its row;  tokens: request id -> the ids whose K/V that row holds

A forward over ``B`` requests reads rows ``0..B-1`` as one padded batch, so ``place`` first
moves the call's requests into those rows; a request already there stays, so a rank that
proposes for the same requests every round moves nothing. Rows past ``B`` hold requests
that skipped this call (a paused request keeps its K/V for its next drafts).

Memory is bounded and outside ``--num-kv-pages``: at most ``max_requests`` rows of at most
``max_len`` positions (``2 * layers * kv_heads * head_dim`` values a position). Both grow on
demand to the high-water mark and are never shrunk; a finished request's row is freed by
``release``, and a call that needs a row when ``max_requests`` are cached evicts the one
unused longest (its next call recomputes its history: slower, never wrong).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

_MIN_LENGTH = 64  # positions allocated at first, doubled as histories grow


class DraftCache:
    """Dense per-request K/V rows with a token record for prefix reuse."""

    def __init__(
        self,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        *,
        max_requests: int,
        max_len: int,
        dtype: torch.dtype,
        device: torch.device | str,
    ) -> None:
        if max_requests < 1 or max_len < 1:
            raise ValueError(
                f"draft cache: max_requests ({max_requests}) and max_len ({max_len}) must be >= 1"
            )
        self.max_requests, self.max_len = max_requests, max_len
        shape = (num_layers, 0, num_kv_heads, 0, head_dim)
        self.k = torch.empty(shape, dtype=dtype, device=device)
        self.v = torch.empty(shape, dtype=dtype, device=device)
        self._row: dict[str, int] = {}
        self._owner: list[str | None] = []  # row -> request id
        self._tokens: dict[str, list[int]] = {}
        self._last_used: dict[str, int] = {}
        self._calls = 0

    @property
    def num_rows(self) -> int:
        return self.k.shape[1]

    @property
    def length(self) -> int:
        """Positions allocated per row (the high-water mark, at most ``max_len``)."""
        return self.k.shape[3]

    @property
    def nbytes(self) -> int:
        return 2 * self.k.numel() * self.k.element_size()

    def tokens(self, request_id: str) -> list[int]:
        """The ids whose K/V the request's row holds, position by position (empty if none)."""
        return self._tokens.get(request_id, [])

    def set_tokens(self, request_id: str, tokens: Sequence[int]) -> None:
        """Record what the request's row now holds (the caller wrote those positions)."""
        self._tokens[request_id] = list(tokens)

    def place(self, request_ids: Sequence[str]) -> list[int]:
        """Rows ``0..B-1`` for the ``B`` requests of a call, in the order given; new
        requests get an empty row (evicting the least recently used others if needed)."""
        count = len(request_ids)
        if count > self.max_requests:
            raise ValueError(
                f"draft model: {count} requests in one call exceed its cache of "
                f"{self.max_requests} (max_requests)"
            )
        if len(set(request_ids)) != count:
            raise ValueError("draft model: a request id appears twice in one call")
        self._calls += 1
        calling = set(request_ids)
        for request_id in request_ids:
            self._last_used[request_id] = self._calls
        new = [r for r in request_ids if r not in self._row]
        others = sorted((r for r in self._row if r not in calling), key=self._last_used.get)
        excess = len(self._row) + len(new) - self.max_requests
        for request_id in others[: max(excess, 0)]:
            self.release(request_id)
        self._grow_rows(len(self._row) + len(new))
        # Cached requests first: each swaps into a low row, so afterwards every request
        # still parked past ``count`` is a non-caller and a free high row exists for it.
        pending = [r for r in request_ids if self._row.get(r, count) >= count]
        pending.sort(key=lambda r: r not in self._row)
        targets = [i for i in range(count) if self._owner[i] not in calling]
        for request_id, row in zip(pending, targets, strict=True):
            source = self._row.get(request_id)
            if source is None:
                occupant = self._owner[row]
                if occupant is not None:  # a request outside this call: out of the way
                    self._swap(row, self._owner.index(None, count))
                self._assign(request_id, row)
            else:
                self._swap(row, source)
        return [self._row[r] for r in request_ids]

    def reserve(self, length: int) -> None:
        """At least ``length`` positions per row (``length <= max_len``)."""
        if length > self.max_len:
            raise ValueError(f"draft cache: {length} positions exceed max_len {self.max_len}")
        if length <= self.length:
            return
        grown = min(self.max_len, max(length, 2 * self.length, _MIN_LENGTH))
        self.k, self.v = (self._resized(t, self.num_rows, grown) for t in (self.k, self.v))

    def write(
        self,
        layer: int,
        rows: torch.Tensor,
        positions: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
    ) -> None:
        """Store ``k``/``v`` ``[N, kv_heads, head_dim]`` at ``(rows[i], positions[i])``."""
        self.k[layer, rows, :, positions] = k
        self.v[layer, rows, :, positions] = v

    def view(self, layer: int, count: int, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values of rows ``0..count-1``, positions ``0..length-1``:
        ``[count, kv_heads, length, head_dim]`` views (no copy)."""
        return self.k[layer, :count, :, :length], self.v[layer, :count, :, :length]

    def release(self, request_id: str) -> None:
        """Free the request's row (unknown ids are ignored: a request may never have drafted)."""
        row = self._row.pop(request_id, None)
        if row is not None:
            self._owner[row] = None
        self._tokens.pop(request_id, None)
        self._last_used.pop(request_id, None)

    def _assign(self, request_id: str, row: int) -> None:
        self._row[request_id] = row
        self._owner[row] = request_id
        self._tokens[request_id] = []

    def _swap(self, a: int, b: int) -> None:
        """Exchange rows ``a`` and ``b`` (their K/V up to the longer record, and owners)."""
        owners = (self._owner[a], self._owner[b])
        used = max((len(self.tokens(r)) for r in owners if r is not None), default=0)
        for tensor in (self.k, self.v):
            if used:
                held = tensor[:, a, :, :used].clone()
                tensor[:, a, :, :used] = tensor[:, b, :, :used]
                tensor[:, b, :, :used] = held
        self._owner[a], self._owner[b] = owners[1], owners[0]
        for row, owner in ((a, owners[1]), (b, owners[0])):
            if owner is not None:
                self._row[owner] = row

    def _grow_rows(self, rows: int) -> None:
        if rows <= self.num_rows:
            return
        grown = min(self.max_requests, max(rows, 2 * self.num_rows))
        self.k, self.v = (self._resized(t, grown, self.length) for t in (self.k, self.v))
        self._owner += [None] * (grown - len(self._owner))

    @staticmethod
    def _resized(tensor: torch.Tensor, rows: int, length: int) -> torch.Tensor:
        layers, old_rows, heads, old_length, dim = tensor.shape
        out = tensor.new_empty((layers, rows, heads, length, dim))
        out[:, :old_rows, :, :old_length] = tensor
        return out
