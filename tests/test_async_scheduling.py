"""``--async-scheduling``: round N+1 planned while round N's forward runs, outputs unchanged.

(a) the offline engine on the tiny model gives the same tokens, logprobs, endings and event
streams with overlap on and off; (b) with a stand-in forward that sleeps (GIL released), the
next round's plan starts before the forward ends; (c) what cannot overlap is refused, naming
the flag; (d) the gate's votes and the gathered rows are the same sequence on and off.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest

from roundgate.actors.control.gather import SingleRankGather
from roundgate.actors.control.rank_loop import RankLoop
from roundgate.actors.control.request import Request, SamplingParams
from roundgate.actors.control.round import RoundPlan, RoundResult, TokenEvent
from roundgate.actors.control.scheduler import Scheduler
from roundgate.actors.engine import Engine
from roundgate.actors.server_args import ServerArgs
from roundgate.gate.permission import Permission
from roundgate.gate.rows import RankRow, RoundView

MODEL = "tiny-llama"
# Prompts of different lengths (one longer than a round's token budget: chunked prefill).
PROMPTS = [
    [1, 2, 3, 4, 5],
    [7] * 23,
    list(range(9, 50)),
    [3, 3],
    [11, 40, 200, 17, 5, 5, 9, 100, 31],
]
MAX_TOKENS = [12, 20, 9, 30, 16]

# ---- (a) the offline engine, on and off ------------------------------------------------


def engine_args(async_scheduling: bool, **overrides: Any) -> ServerArgs:
    values: dict[str, Any] = {
        "model": MODEL,
        "device": "cpu",
        "page_size": 4,
        "num_kv_pages": 96,
        "max_scheduled_tokens": 16,
        "max_num_seqs": 8,
        "async_scheduling": async_scheduling,
    }
    return ServerArgs(**(values | overrides))


@dataclass
class Generated:
    """What one engine run left on its requests, and the events it streamed per request."""

    outputs: list[list[int]]
    logprobs: list[list[Any]]
    prompt_logprobs: list[list[Any]]
    reasons: list[str | None]
    streams: dict[str, list[tuple[int | None, bool]]] = field(default_factory=dict)
    # The prefix cache's page keys at the end: the pages keyed as requests ended.
    cached_keys: frozenset[Any] = frozenset()


def generate(
    async_scheduling: bool,
    sampling: Sequence[SamplingParams],
    abort_after: tuple[int, str] | None = None,
    **overrides: Any,
) -> Generated:
    engine = Engine(engine_args(async_scheduling, **overrides))
    streams: dict[str, list[tuple[int | None, bool]]] = {}

    def on_event(event: TokenEvent) -> None:
        streams.setdefault(event.request.request_id, []).append((event.token_id, event.finished))

    engine.core.on_event = on_event
    requests = [
        Request(f"r{i}", list(ids), sp)
        for i, (ids, sp) in enumerate(zip(PROMPTS, sampling, strict=True))
    ]
    if abort_after is None:
        engine.run(requests)
    else:  # ``rounds`` steps, then the client cancels ``request_id``
        rounds, request_id = abort_after
        for req in requests:
            engine.core.submit(req)
        for _ in range(rounds):
            engine.core.step()
        engine.core.abort(request_id)
        engine.run([])
    engine.core.loop.close()
    scheduler = engine.core.scheduler
    scheduler.pool.check_integrity()
    assert scheduler.pool.num_used_pages == 0 and not scheduler.has_unfinished
    return Generated(
        [r.output_token_ids for r in requests],
        [r.output_logprobs for r in requests],
        [r.prompt_logprobs for r in requests],
        [r.finish_reason for r in requests],
        streams,
        frozenset(engine.core.scheduler.pool.cached_keys()),
    )


def greedy(**extra: Any) -> list[SamplingParams]:
    return [SamplingParams(max_tokens=m, **extra) for m in MAX_TOKENS]


def seeded(**extra: Any) -> list[SamplingParams]:
    return [
        SamplingParams(max_tokens=m, temperature=0.9, top_p=0.95, seed=7 + i, **extra)
        for i, m in enumerate(MAX_TOKENS)
    ]


CASES = {
    "greedy": (greedy(), {}),
    "greedy-mixed": (greedy(), {"enable_mixed_prefill_decode": True}),
    "seeded-logprobs": (seeded(logprobs=3), {}),
    "penalties": (greedy(frequency_penalty=0.5, repetition_penalty=1.2), {}),
    "prompt-logprobs": (greedy(prompt_logprobs=2), {}),
    "prefix-caching": (greedy(), {"enable_prefix_caching": True}),
    # A pool too small for every request at once: retraction and readmission under pressure.
    "kv-pressure": (seeded(), {"num_kv_pages": 22}),
}


def _sampling_fields(sp: SamplingParams) -> dict[str, Any]:
    return {k: v for k, v in sp.__dict__.items() if k != "needs_transforms"}


def stopped(params: list[SamplingParams], outputs: list[list[int]]) -> list[SamplingParams]:
    """Every other request stops on a token it samples mid-way, the others on the model's
    EOS as well: stops the plan of the next round cannot know."""
    eos = tuple(ServerArgs(model=MODEL, device="cpu").model_config.eos_token_ids)
    stops = []
    for i, (sp, out) in enumerate(zip(params, outputs, strict=True)):
        ids = (out[len(out) // 2],) if i % 2 == 0 else eos
        stops.append(SamplingParams(**{**_sampling_fields(sp), "stop_token_ids": ids}))
    return stops


@pytest.mark.parametrize("case", sorted(CASES))
def test_outputs_equal_on_and_off(case: str) -> None:
    sampling, overrides = CASES[case]
    off = generate(False, sampling, **overrides)
    on = generate(True, sampling, **overrides)
    assert on == off


@pytest.mark.parametrize(
    "case", ["greedy", "seeded-logprobs", "kv-pressure", "prefix-caching", "greedy-mixed"]
)
def test_stop_tokens_end_the_same_on_and_off(case: str) -> None:
    sampling, overrides = CASES[case]
    plain = generate(False, sampling, **overrides)
    sampling = stopped(sampling, plain.outputs)
    off = generate(False, sampling, **overrides)
    on = generate(True, sampling, **overrides)
    assert "stop" in off.reasons  # the stop path ran
    assert on == off


@pytest.mark.parametrize("rounds", [1, 4, 9])
def test_an_abort_mid_stream_ends_the_same_on_and_off(rounds: int) -> None:
    sampling = CASES["seeded-logprobs"][0]
    off = generate(False, sampling, abort_after=(rounds, "r1"))
    on = generate(True, sampling, abort_after=(rounds, "r1"))
    assert off.reasons[1] == "abort"
    assert on == off


# ---- stand-in forwards -----------------------------------------------------------------


def stand_in_token(req: Request) -> int:
    """A deterministic token from the request and its position (never 0)."""
    return (sum(req.prompt_token_ids) * 31 + len(req.output_token_ids) * 7) % 97 + 1


class SleepingForward:
    """An executor whose forward sleeps ``forward_s`` (the GIL released, like a GPU's wait)
    and samples ``stand_in_token``; it records each forward's (start, end)."""

    def __init__(self, forward_s: float = 0.0) -> None:
        self.forward_s = forward_s
        self.spans: list[tuple[float, float]] = []
        self.threads: set[str] = set()

    def execute(self, plan: RoundPlan, rows: Sequence[RankRow], view: RoundView) -> RoundResult:
        start = time.perf_counter()
        self.threads.add(threading.current_thread().name)
        if self.forward_s:
            time.sleep(self.forward_s)
        sampled = {
            c.request.request_id: stand_in_token(c.request) for c in plan.chunks if c.samples
        }
        end = time.perf_counter()
        self.spans.append((start, end))
        return RoundResult(sampled, end - start)


class TimedScheduler(Scheduler):
    """Records when each plan starts."""

    def __init__(self, args: ServerArgs) -> None:
        super().__init__(args)
        self.plan_starts: list[float] = []

    def plan(self, permission: Permission) -> RoundPlan:
        self.plan_starts.append(time.perf_counter())
        return super().plan(permission)


# ---- (b) the plan of round N+1 starts while round N's forward runs ------------------


@pytest.mark.parametrize("overlap", [False, True])
def test_next_plan_starts_during_the_forward(overlap: bool) -> None:
    args = engine_args(overlap)
    scheduler = TimedScheduler(args)
    forward = SleepingForward(0.015)
    loop = RankLoop(
        scheduler, args.build_policy(0), forward, 1, SingleRankGather(), overlap=overlap
    )
    for i in range(4):
        scheduler.add_request(Request(f"s{i}", [5 + i] * 6, SamplingParams(max_tokens=6)))
    for _ in range(50):
        if not (scheduler.has_unfinished or loop.has_in_flight):
            break
        loop.step()
    loop.close()
    # Plan k+1 against forward k (forward k is the forward of plan k: idle rounds run none).
    overlapped = sum(
        1
        for (start, end), next_plan in zip(forward.spans, scheduler.plan_starts[1:], strict=False)
        if next_plan < end
    )
    if overlap:
        assert overlapped >= len(forward.spans) - 1
        assert all(name.startswith("roundgate-forward") for name in forward.threads)
    else:
        assert overlapped == 0


# ---- (c) refusals ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("overrides", "names"),
    [
        (
            {"speculative_config": '{"method": "ngram", "num_speculative_tokens": 2}'},
            "--speculative-config",
        ),
        ({"disaggregation_mode": "prefill"}, "--disaggregation-mode prefill"),
        ({"disaggregation_mode": "decode"}, "--disaggregation-mode decode"),
    ],
)
def test_refused_settings_name_the_flag(overrides: dict[str, Any], names: str) -> None:
    with pytest.raises(ValueError, match="--async-scheduling") as info:
        engine_args(True, **overrides)
    assert names in str(info.value)
    engine_args(False, **overrides)  # the same settings are fine without overlap


@pytest.mark.parametrize(
    ("sampling", "names"),
    [
        (SamplingParams(grammar=("json_schema", '{"type": "object"}')), "structured output"),
        (SamplingParams(n=2), "n=2"),
    ],
)
def test_refused_requests_name_the_flag(sampling: SamplingParams, names: str) -> None:
    engine = Engine(engine_args(True))
    with pytest.raises(ValueError, match="--async-scheduling") as info:
        engine.core.submit(Request("x", [1, 2, 3], sampling))
    assert names in str(info.value)


def test_dp_groups_may_overlap() -> None:
    assert engine_args(True, dp_size=2).async_scheduling
    assert engine_args(True, model="tiny-moe", dp_size=2).async_scheduling


# ---- (d) the gate votes the same -------------------------------------------------------


@dataclass(frozen=True)
class Arrival:
    round: int
    rank: int
    prompt_len: int
    max_tokens: int


WORKLOAD = [
    Arrival(0, 0, 6, 12),
    Arrival(0, 1, 3, 20),
    Arrival(2, 1, 30, 5),
    Arrival(5, 0, 9, 3),
    Arrival(6, 0, 17, 25),
    Arrival(9, 1, 4, 9),
    Arrival(14, 0, 40, 6),
    Arrival(15, 1, 2, 14),
    Arrival(21, 1, 12, 2),
]


def gate_args(**overrides: Any) -> ServerArgs:
    values: dict[str, Any] = {
        "model": MODEL,
        "device": "cpu",
        "dp_size": 2,
        "max_num_seqs": 6,
        "max_scheduled_tokens": 16,
        "page_size": 4,
        "num_kv_pages": 40,
        "prefill_attempt_interval": 3,
        "prefill_any_attempt_interval": 6,
    }
    return ServerArgs(**(values | overrides))


@dataclass
class GroupRun:
    """Per round of a group drive: both ranks' votes and the gathered rows, and per rank the
    requests the round's events ended on a stop token."""

    rounds: list[tuple[Any, ...]] = field(default_factory=list)
    stops: list[tuple[int, ...]] = field(default_factory=list)


def drive_group(args: ServerArgs, overlap: bool, stop_token_ids: tuple[int, ...] = ()) -> GroupRun:
    """The scripted workload through two in-process RankLoops, round by round (rounds with
    work only: the overlap's last round only drains)."""
    loops = [
        RankLoop(
            Scheduler(args),
            args.build_policy(rank),
            SleepingForward(),
            args.dp_size,
            clock=lambda: 0.0,
            overlap=overlap,
        )
        for rank in range(args.dp_size)
    ]
    run = GroupRun()
    for rnd in range(400):
        for a in WORKLOAD:
            if a.round == rnd:
                prompt = [a.rank + 3] * a.prompt_len
                sampling = SamplingParams(max_tokens=a.max_tokens, stop_token_ids=stop_token_ids)
                loops[a.rank].scheduler.add_request(Request(f"w{rnd}-{a.rank}", prompt, sampling))
        if rnd > WORKLOAD[-1].round and not any(
            loop.scheduler.has_unfinished or loop.has_in_flight for loop in loops
        ):
            break
        rows = [loop.begin() for loop in loops]
        outcomes = [loop.finish(rows) for loop in loops]
        run.rounds.append((tuple((o.vote.open, o.vote.point) for o in outcomes), tuple(rows)))
        run.stops.append(
            tuple(
                sum(e.finished and e.request.finish_reason == "stop" for e in o.events)
                for o in outcomes
            )
        )
    for loop in loops:
        loop.close()
    while run.rounds and all(not (row.batch_size or row.num_tokens) for row in run.rounds[-1][1]):
        run.rounds.pop()  # trailing idle rounds: the overlap drains its last result in one
    return run


@pytest.mark.parametrize("mixed", [False, True])
def test_gate_votes_and_rows_equal_on_and_off(mixed: bool) -> None:
    args = gate_args(enable_mixed_prefill_decode=mixed)
    off = drive_group(args, overlap=False)
    on = drive_group(args, overlap=True)
    assert any(opened for votes, _ in off.rounds for opened, _ in votes)  # the gate did open
    assert on.rounds == off.rounds


def test_rows_first_differ_by_a_stopped_request_s_extra_decode() -> None:
    """A stop token is what the next plan cannot know: the rows are the same up to the round
    after the first stop, where the stopping rank's row counts that request's one more decode
    (its output discarded); nothing else differs in that round."""
    stops = tuple(range(1, 98, 9))  # some of the stand-in's tokens
    off = drive_group(gate_args(), overlap=False, stop_token_ids=stops)
    on = drive_group(gate_args(), overlap=True, stop_token_ids=stops)
    first_stop = next(r for r, per_rank in enumerate(off.stops) if any(per_rank))
    differ = next(r for r, (a, b) in enumerate(zip(off.rounds, on.rounds, strict=False)) if a != b)
    assert differ == first_stop + 1
    assert on.rounds[differ][0] == off.rounds[differ][0]  # this round's votes: last round's rows
    for rank, (a, b) in enumerate(zip(off.rounds[differ][1], on.rounds[differ][1], strict=True)):
        extra = off.stops[first_stop][rank]
        assert (b.batch_size - a.batch_size, b.num_tokens - a.num_tokens) == (extra, extra)
        assert b.num_extends == a.num_extends
