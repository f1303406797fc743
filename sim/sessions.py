"""Multi-turn workloads with shared prefixes: chat sessions and agentic sessions.

Every session opens with the same system prompt (shared by all sessions), and each turn
resends the whole conversation so far (earlier prompts, the answers the ranks actually gave,
and the new message), so a rank that still holds the previous turn's pages prefills only
the new part. A turn is sent ``think_s`` after the previous one finished (the user reading
and typing, or the agent's tool running): a closed loop, which is why follow-up turns are
built while the run goes (``Session.next_turn``) rather than listed up front.

Lengths are Mooncake-like: its tool-and-agent trace averages 8596 prompt and 182 output
tokens per request, most of the prompt being context carried over from earlier turns.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Sequence
from dataclasses import dataclass

from roundgate.actors.control.request import Request
from roundgate.sim.arrivals import INF, Arrival, ClosedLoop, OpenLoop


@dataclass(frozen=True)
class SessionPreset:
    """Mean lengths (tokens, drawn uniform +-50 %), turns per session and think time (s)."""

    system_len: int
    first_user_len: int
    user_len: int  # each later turn's new input (a user message, a tool result)
    output_len: int
    turns: int
    think_s: float  # mean, exponential


SESSION_WORKLOADS: dict[str, SessionPreset] = {
    # ShareGPT-like turns behind a short shared system prompt; people read and type.
    "chat-sessions": SessionPreset(200, 120, 80, 200, 5, 4.0),
    # Tool calling: a long shared tool/system prompt, tool results appended each step
    # (context ~3.5k -> ~12k over 10 turns, ~8k on average), short answers, quick tools.
    "agentic-sessions": SessionPreset(3000, 500, 800, 182, 10, 1.0),
}


@dataclass(frozen=True, eq=False)
class Session:
    """One conversation: its draws are fixed at construction; only the answers come later."""

    session_id: int
    start_s: float
    system: tuple[int, ...]
    user_turns: list[tuple[int, ...]]
    output_lens: list[int]
    think_s: list[float]

    @property
    def num_turns(self) -> int:
        return len(self.user_turns)

    def first_turn(self) -> Arrival:
        return self._turn(0, self.start_s, (*self.system, *self.user_turns[0]))

    def next_turn(
        self, previous: Arrival, finish_s: float, output_ids: Sequence[int]
    ) -> Arrival | None:
        """The turn after ``previous`` (which finished at ``finish_s`` with ``output_ids``):
        its prompt, its answer and the next message. Stateless, so one session list can be
        replayed by several runs."""
        turn = previous.turn + 1
        if turn >= self.num_turns:
            return None
        prompt = (*(previous.token_ids or ()), *output_ids, *self.user_turns[turn])
        return self._turn(turn, finish_s + self.think_s[turn - 1], prompt)

    def _turn(self, turn: int, time_s: float, prompt: tuple[int, ...]) -> Arrival:
        return Arrival(
            time_s,
            len(prompt),
            self.output_lens[turn],
            token_ids=prompt,
            session=self,
            turn=turn,
        )


@dataclass(frozen=True)
class SessionSpec:
    """What determines a session workload; same spec and seed, same sessions."""

    preset: SessionPreset
    num_sessions: int = 64
    rate: float = 4.0  # new sessions per second (Poisson)
    vocab_size: int = 512
    seed: int = 0

    def __post_init__(self) -> None:
        if self.num_sessions < 1:
            raise ValueError(f"--num-sessions must be >= 1, got {self.num_sessions}")
        if not self.rate > 0:
            raise ValueError(f"--rate must be > 0, got {self.rate}")


def _length(rng: random.Random, mean: int) -> int:
    return rng.randint(max(1, mean // 2), max(1, mean * 3 // 2))


def make_sessions(spec: SessionSpec) -> list[Session]:
    """The sessions of ``spec``, by start time (token ids random in ``[1, vocab)``)."""
    rng = random.Random(spec.seed)
    p = spec.preset

    def tokens(n: int) -> tuple[int, ...]:
        return tuple(rng.randrange(1, spec.vocab_size) for _ in range(n))

    system = tokens(p.system_len)
    sessions = []
    t = 0.0
    for i in range(spec.num_sessions):
        t += rng.expovariate(spec.rate)
        users = [
            tokens(_length(rng, p.first_user_len if k == 0 else p.user_len)) for k in range(p.turns)
        ]
        sessions.append(
            Session(
                i,
                t,
                system,
                users,
                [_length(rng, p.output_len) for _ in range(p.turns)],
                [rng.expovariate(1.0 / p.think_s) for _ in range(p.turns)],
            )
        )
    return sessions


def max_prompt_tokens(session: Session) -> int:
    """The last turn's prompt length if every answer runs to its full length."""
    return (
        len(session.system)
        + sum(len(u) for u in session.user_turns)
        + sum(session.output_lens[:-1])
    )


def first_turns(spec: SessionSpec) -> list[Arrival]:
    """The arrivals a run starts from: each session's first turn (the rest follow)."""
    return [session.first_turn() for session in make_sessions(spec)]


class SessionLoop:
    """Sessions as an arrival source: the first turns as listed, each later turn sent
    ``think_s`` after its previous turn finished (the simulator's ``finished`` call)."""

    def __init__(self, first_turns: Sequence[Arrival]) -> None:
        self._ready = [(a.time_s, i, a) for i, a in enumerate(first_turns)]
        heapq.heapify(self._ready)
        self._order = len(self._ready)  # tie-breaker for the heap
        self._sent = 0
        self._in_flight: dict[str, Arrival] = {}  # request id -> its turn

    @property
    def next_send_s(self) -> float:
        return self._ready[0][0] if self._ready else INF

    @property
    def exhausted(self) -> bool:
        return not self._ready and not self._in_flight

    def pop(self) -> tuple[int, Arrival]:
        _, _, arrival = heapq.heappop(self._ready)
        index = self._sent
        self._sent += 1
        self._in_flight[f"req-{index}"] = arrival  # the simulator's request id
        return index, arrival

    def finished(self, now_s: float, request: Request | None = None) -> None:
        arrival = self._in_flight.pop(request.request_id, None) if request else None
        if arrival is None or arrival.session is None:
            return
        follow = arrival.session.next_turn(arrival, now_s, request.output_token_ids)
        if follow is not None:
            heapq.heappush(self._ready, (follow.time_s, self._order, follow))
            self._order += 1


def arrival_source(
    arrivals: Sequence[Arrival], concurrency: int | None
) -> OpenLoop | ClosedLoop | SessionLoop:
    """Closed-loop clients (``concurrency``), sessions (turns carry one), or the list."""
    if concurrency is not None:
        return ClosedLoop(arrivals, concurrency)
    if any(a.session is not None for a in arrivals):
        return SessionLoop(arrivals)
    return OpenLoop(arrivals)
