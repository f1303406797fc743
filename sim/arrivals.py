"""Where the simulator's requests come from: one ``Arrival`` each, from a fixed arrival list
(open loop) or N clients that each send their next request when the previous one finishes
(closed loop); ``roundgate.sim.sessions`` adds multi-turn sessions.

Both hand the simulator requests in send order; the simulator routes each when it is sent
and hands it to its rank's scheduler ``schedule_lag_ms`` later.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from roundgate.actors.control.request import Request

INF = float("inf")


class Conversation(Protocol):
    """What an arrival knows of the session it is a turn of (``roundgate.sim.sessions.Session``):
    its id (the cache-aware router's affinity key) and how to build the turn after it."""

    @property
    def session_id(self) -> int: ...

    def next_turn(
        self, previous: Arrival, finish_s: float, output_ids: Sequence[int]
    ) -> Arrival | None: ...


@dataclass(frozen=True, slots=True)
class Arrival:
    """One request of the workload: when it arrives and how long its prompt and output are."""

    time_s: float
    prompt_tokens: int
    output_tokens: int
    rank: int | None = None  # a pinned rank (traces may pin); None lets the router choose
    # A session's turn carries its prompt (a shared prefix and the conversation so far);
    # otherwise every prompt is distinct filler of ``prompt_tokens`` tokens.
    token_ids: tuple[int, ...] | None = field(default=None, repr=False, compare=False)
    session: Conversation | None = field(default=None, repr=False, compare=False)
    turn: int = 0


class OpenLoop:
    """A fixed, time-sorted arrival list (Poisson, bursty or a trace)."""

    def __init__(self, arrivals: Sequence[Arrival]) -> None:
        self.arrivals = arrivals
        self._next = 0

    @property
    def next_send_s(self) -> float:
        """When the next request is sent (inf when none is left)."""
        if self._next < len(self.arrivals):
            return self.arrivals[self._next].time_s
        return INF

    @property
    def exhausted(self) -> bool:
        return self._next >= len(self.arrivals)

    def pop(self) -> tuple[int, Arrival]:
        """The next request (its index names it) with its send time."""
        index = self._next
        self._next += 1
        return index, self.arrivals[index]

    def finished(self, now_s: float, request: Request | None = None) -> None:
        """A request finished: an open-loop workload does not care."""


class ClosedLoop:
    """``concurrency`` clients, each sending its next request the moment its last finishes.

    The lengths come from ``shapes`` (an arrival list's prompt/output lengths, in order);
    every client sends its first request at time 0, as a benchmark client does.
    """

    def __init__(self, shapes: Sequence[Arrival], concurrency: int) -> None:
        if concurrency < 1:
            raise ValueError(f"--concurrency must be >= 1, got {concurrency}")
        self.shapes = shapes
        self._sent = 0
        self._ready: list[float] = [0.0] * min(concurrency, len(shapes))  # send times (heap)

    @property
    def next_send_s(self) -> float:
        if self._ready and self._sent < len(self.shapes):
            return self._ready[0]
        return INF

    @property
    def exhausted(self) -> bool:
        return self._sent >= len(self.shapes)

    def pop(self) -> tuple[int, Arrival]:
        send_s = heapq.heappop(self._ready)
        index = self._sent
        self._sent += 1
        shape = self.shapes[index]
        return index, Arrival(send_s, shape.prompt_tokens, shape.output_tokens, shape.rank)

    def finished(self, now_s: float, request: Request | None = None) -> None:
        """The client whose request finished sends its next one now."""
        heapq.heappush(self._ready, now_s)
