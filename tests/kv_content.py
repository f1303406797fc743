"""A fake executor that tracks what each KV page slot holds, to check prefix sharing.

Every chunk first *reads* its context (positions before its start) from its page table and
checks it holds the request's own tokens, then *writes* its tokens. Its sample is a function
of the context it read, so a corrupted page would change the outputs, and a run with prefix
caching must sample exactly what a run without it does.
"""

from __future__ import annotations

from collections.abc import Sequence

from roundgate.actors.control.round import RoundPlan, RoundResult
from roundgate.actors.control.scheduler import Scheduler


class ContentExecutor:
    """Page contents as token lists; asserts reads see the request's tokens."""

    def __init__(self, scheduler: Scheduler) -> None:
        self.scheduler = scheduler
        self.page_size = scheduler.pool.page_size
        self.slots: dict[int, list[int | None]] = {}
        self.parked: dict[str, list[list[int | None]]] = {}
        # Start of each request's first prefill chunk: the tokens it did not compute.
        self.first_start: dict[str, int] = {}
        self.computed_tokens = 0

    def _slot(self, page: int) -> list[int | None]:
        return self.slots.setdefault(page, [None] * self.page_size)

    def execute(self, plan: RoundPlan, rows: Sequence = (), view=None) -> RoundResult:
        size = self.page_size
        for req, old_pages in plan.retracted:  # as the runner: park, then restore
            if old_pages:
                self.parked[req.request_id] = [list(self._slot(p)) for p in old_pages]
        for req in plan.readmitted:
            saved = self.parked.pop(req.request_id, [])
            for page, content in zip(req.page_ids, saved, strict=False):
                self.slots[page] = list(content)
        for source, target in plan.page_copies:
            self.slots[target] = list(self._slot(source))
        sampled: dict[str, int] = {}
        writers: dict[int, str] = {}
        for chunk in plan.chunks:  # every read before any write of the round
            req = chunk.request
            ids = req.token_ids(0, chunk.end)
            read = [self._slot(req.page_ids[p // size])[p % size] for p in range(chunk.start)]
            assert read == ids[: chunk.start], f"{req.request_id}: context corrupted"
            if chunk.is_prefill:
                self.first_start.setdefault(req.request_id, chunk.start)
            if chunk.samples:
                sampled[req.request_id] = (sum(read) + sum(ids[chunk.start :])) % 5
        for chunk in plan.chunks:
            req = chunk.request
            self.computed_tokens += chunk.num_tokens
            for pos in range(chunk.start, chunk.end):
                page = req.page_ids[pos // size]
                assert writers.setdefault(page, req.request_id) == req.request_id
                assert self.scheduler.pool.num_holders(page) == 1, f"write into shared {page}"
                self._slot(page)[pos % size] = req.token_ids(pos, pos + 1)[0]
        return RoundResult(sampled, 0.001 * len(plan.chunks))

    def drop_parked(self, request_id: str) -> None:
        self.parked.pop(request_id, None)
