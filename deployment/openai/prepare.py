"""Request preparation off the ingress's event loop: chat template rendering and tokenization.

Every stream an ingress replica serves is driven by its one asyncio loop, so CPU work done on
that loop (a Jinja render, a tokenizer call) delays every other stream's next chunk: a 1 MiB
batched chat of tiny conversations rendered inline stalled a concurrent stream for as long as
its renders took. ``Preparer`` runs that work on a small thread pool of its own.

Why a pool of its own, of ``PREPARE_WORKERS`` threads, rather than ``asyncio.to_thread``:
Jinja rendering holds the GIL (only the HF fast tokenizer's Rust core releases it), so a
worker thread helps the loop only because CPython hands the GIL back to a waiting thread
every switch interval (5 ms). With one or two render threads the loop waits at most about one
interval for it; the loop's default executor grows to 32 threads under a flood, and the loop
then competes with all of them for the GIL. The bound also keeps a flood's preparation in a
queue instead of on as many threads as there are requests. One batch is prepared in one call
(not a call per conversation): the GIL hand-off already bounds how long the loop waits, and
one call costs one queue slot and one wake-up.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import ParamSpec, TypeVar

# Two: a small chat is not queued behind one flood body, and the loop competes with at most
# two threads for the GIL (see the module doc).
PREPARE_WORKERS = 2

P = ParamSpec("P")
T = TypeVar("T")


class Preparer:
    """A bounded thread pool for one ingress replica's renders and tokenizations."""

    def __init__(self, max_workers: int = PREPARE_WORKERS) -> None:
        if max_workers < 1:
            raise ValueError(f"max_workers must be >= 1, got {max_workers}")
        self._pool = ThreadPoolExecutor(max_workers, thread_name_prefix="roundgate-prepare")

    async def run(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """``fn(*args, **kwargs)`` on a worker thread; its result, or its exception, here."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, functools.partial(fn, *args, **kwargs))

    def close(self) -> None:
        """Stop the threads once the work queued so far has run (the replica's shutdown)."""
        self._pool.shutdown(wait=False, cancel_futures=True)
