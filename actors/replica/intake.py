"""Prompts into a rank's engine, chunks back out: the intake of a fused or a prefill rank.

A request's stream opens before it is submitted, so none of its events is missed; a grammar
it needs compiles on a worker of its own while the request waits in the scheduler's
``LOADING`` state (the rank keeps running rounds for everyone else). Then the group is woken
and the request's events come back as chunks (``chunks.relay``) until it ends, or until an
item of the caller's ``until`` type (a prefill rank's ``Handoff``).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from roundgate.actors.control.messages import GenerateChunk, Usage
from roundgate.actors.control.request import Request
from roundgate.actors.replica.chunks import ChunkBuilder, relay
from roundgate.actors.replica.rank_engine import RankEngine


class PromptIntake:
    """Submits prompts to ``engine`` and relays their chunks. ``grammars``: the runner's
    grammar cache (None: an executor without one; a grammar request then cannot run);
    ``wake``: the membership's; ``note_arrival``: the rank's metrics'."""

    def __init__(
        self,
        engine: RankEngine,
        grammars: Any,
        wake: Callable[[], None],
        note_arrival: Callable[[str], None],
    ) -> None:
        self.engine = engine
        self.args = engine.args
        self.grammars = grammars
        self.wake = wake
        self.note_arrival = note_arrival
        # One worker: compiles queue rather than take CPU from the rounds.
        self.grammar_worker = ThreadPoolExecutor(1, thread_name_prefix="grammar")

    async def stream(self, request: Request, until: type | None = None) -> AsyncIterator[Any]:
        """Submit ``request`` and relay its chunks (``until``: an item type that ends the
        relay, e.g. a prefill rank's ``Handoff``)."""
        engine = self.engine
        engine.check_serving()
        request_id = request.request_id
        queue = engine.open_stream(request_id)
        if queue is None:  # refuse this one alone
            usage = Usage(prompt_tokens=request.num_prompt_tokens, completion_tokens=0)
            error = f"request id {request_id!r} is already streaming on this rank"
            yield GenerateChunk(token_ids=(), finish_reason="error", usage=usage, error=error)
            return
        core = engine.core
        finished = False
        builder: ChunkBuilder | None = None
        try:
            grammar = request.sampling.grammar
            loading = grammar is not None and not self.grammars.is_compiled(grammar)
            submitted = False
            try:
                core.submit(request, loading=loading)
                submitted = True
                if loading:
                    await self._compile(grammar)
            except ValueError as exc:  # this request cannot run here; the group is fine
                finished = True
                if submitted:  # its grammar failed: take back what waits in LOADING
                    core.abort(request_id)
                yield GenerateChunk(
                    token_ids=(),
                    finish_reason="error",
                    usage=Usage(prompt_tokens=request.num_prompt_tokens, completion_tokens=0),
                    error=str(exc),
                )
                return
            if loading:
                core.mark_loaded(request_id)
            self.wake()
            self.note_arrival(request_id)
            builder = ChunkBuilder(request, self.args.stream_interval)
            async for chunk in relay(builder, queue, until):
                yield chunk
            finished = True
        finally:
            engine.close_stream(request_id)
            if not finished:
                # The caller went away (or the group failed): free the request's pages.
                for sequence in builder.unfinished_ids() if builder else [request_id]:
                    core.abort(sequence)

    async def _compile(self, grammar: tuple[str, str]) -> None:
        """Compile ``grammar`` on the grammar worker, within ``--max-grammar-compile-s``; a
        ValueError (this request's 400) when it does not compile or takes too long.

        A compile past the limit still runs to its end on the worker (a thread cannot be
        stopped); later compiles queue behind it, which is why the ingress bounds a grammar's
        size before it gets here.
        """
        limit = self.args.max_grammar_compile_s
        loop = asyncio.get_running_loop()
        future = loop.run_in_executor(self.grammar_worker, self.grammars.compile, grammar)
        try:
            await asyncio.wait_for(asyncio.shield(future), limit)
        except TimeoutError:
            raise ValueError(
                f"{grammar[0]}: the grammar did not compile within {limit:g} s "
                "(--max-grammar-compile-s)"
            ) from None
