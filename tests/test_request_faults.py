"""A request whose planning or forward raises fails alone: its stream gets the error, the
rank's other requests finish exactly as they would have without it, and the loop goes on."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from builders import make_args, make_request

import roundgate.actors.model.round_sampling as sampling_module
from roundgate.actors.control.engine_core import EngineCore
from roundgate.actors.control.kv_pool import KVPool
from roundgate.actors.control.request import Request, RequestStatus, SamplingParams
from roundgate.actors.control.round import RoundPlan, RoundResult, TokenEvent
from roundgate.actors.engine import Engine, RequestsFailed
from roundgate.actors.server_args import ServerArgs
from roundgate.gate.rows import RankRow, RoundView
from roundgate.sim.cost_executor import CostExecutor
from roundgate.sim.round_costs import TOY


def inject_fault(pool: KVPool, owner: str, methods: tuple[str, ...]) -> None:
    """Make the pool's ``methods`` raise for one owner (a bookkeeping bug in one request);
    the instance is patched, so the scheduler's prefix cache sees the same faulty pool."""
    for method in methods:
        real = getattr(pool, method)

        def faulty(who, *args, real=real, method=method):  # type: ignore[no-untyped-def]
            if who == owner:
                raise RuntimeError(f"injected {method} fault")
            return real(who, *args)

        setattr(pool, method, faulty)


# The pool calls that plan a request's pages: admission (plain or on a cached prefix), a
# prefill chunk's pages, and a decode's next page.
PLANNING_CALLS = {
    "admit": ("allocate", "allocate_cached"),
    "extend": ("extend",),
    "grow": ("grow",),
}


class EchoExecutor(CostExecutor):
    """Samples each request's own output count (so outputs show any cross-talk), and fails
    the requests named in ``fail``."""

    def __init__(self, fail: Sequence[str] = ()) -> None:
        super().__init__(TOY)
        self.fail = set(fail)

    def execute(self, plan: RoundPlan, rows: Sequence[RankRow], view: RoundView) -> RoundResult:
        result = super().execute(plan, rows, view)
        for chunk in plan.chunks:
            rid = chunk.request.request_id
            if rid in self.fail:
                result.sampled.pop(rid, None)
                result.failed[rid] = "injected forward fault"
            elif chunk.samples:
                result.sampled[rid] = 10 + chunk.request.num_output_tokens
        return result


def run(core: EngineCore, requests: list[Request], rounds: int = 80) -> list[TokenEvent]:
    events: list[TokenEvent] = []
    core.on_event = events.append
    for req in requests:
        core.submit(req)
    for _ in range(rounds):
        if not core.has_local_work:
            break
        core.step()
        core.scheduler.pool.check_integrity()
    assert not core.has_local_work
    return events


def batch(prefix: str = "") -> list[Request]:
    return [make_request(f"{prefix}{i}", prompt_len=5 + i, max_tokens=6) for i in range(3)]


def outputs_without_fault() -> dict[str, list[int]]:
    core = EngineCore(make_args(1, "none", num_kv_pages=12), EchoExecutor())
    reqs = batch()
    run(core, reqs)
    return {r.request_id: r.output_token_ids for r in reqs}


@pytest.mark.parametrize("step", list(PLANNING_CALLS))
def test_a_planning_fault_fails_only_that_request(step: str) -> None:
    expected = outputs_without_fault()
    core = EngineCore(make_args(1, "none", num_kv_pages=12), EchoExecutor())
    methods = [m for m in PLANNING_CALLS[step] if hasattr(core.scheduler.pool, m)]
    inject_fault(core.scheduler.pool, "bad", tuple(methods))
    reqs = batch()
    bad = make_request("bad", prompt_len=3, max_tokens=6)
    events = run(core, [*reqs, bad])
    assert bad.status is RequestStatus.FINISHED_ERROR
    assert bad.finish_reason == "error"
    assert "scheduling" in bad.error and "fault" in bad.error
    assert [e for e in events if e.request is bad][-1].finished
    assert {r.request_id: r.output_token_ids for r in reqs} == expected
    assert core.scheduler.num_failures == 1
    assert core.scheduler.pool.num_used_pages == 0


def test_a_forward_fault_fails_only_that_request() -> None:
    expected = outputs_without_fault()
    core = EngineCore(make_args(1, "none", num_kv_pages=12), EchoExecutor(fail=["bad"]))
    reqs = batch()
    bad = make_request("bad", prompt_len=3, max_tokens=6)
    run(core, [*reqs, bad])
    assert bad.status is RequestStatus.FINISHED_ERROR and bad.error == "injected forward fault"
    assert {r.request_id: r.output_token_ids for r in reqs} == expected
    assert core.scheduler.pool.num_used_pages == 0


# ---- the real model runner ----------------------------------------------------------------

POISON_SEED = 4242  # the injected sampler below fails any batch holding this seed


def poisoned(real):  # type: ignore[no-untyped-def]
    def sample_round(logits, requests, generator, grammars=None):  # type: ignore[no-untyped-def]
        if any(r.sampling.seed == POISON_SEED for r in requests):
            raise FloatingPointError("injected: probability tensor contains nan")
        return real(logits, requests, generator, grammars)

    return sample_round


def tiny_engine() -> Engine:
    return Engine(ServerArgs(model="tiny-llama", page_size=4, num_kv_pages=64))


PROMPTS = [[5, 6, 7, 8, 9], [11, 12, 13], [20, 21, 22, 23, 24, 25, 26]]


def test_a_sampling_fault_fails_only_that_request(monkeypatch: pytest.MonkeyPatch) -> None:
    greedy = SamplingParams(max_tokens=6)
    expected = tiny_engine().generate(PROMPTS, greedy)
    monkeypatch.setattr(sampling_module, "sample_round", poisoned(sampling_module.sample_round))
    engine = tiny_engine()
    bad = SamplingParams(max_tokens=6, temperature=1.0, seed=POISON_SEED)
    with pytest.raises(RequestsFailed) as failure:
        engine.generate([*PROMPTS, [3, 4]], [greedy, greedy, greedy, bad])
    assert list(failure.value.errors) == [3]
    assert "sampling failed" in failure.value.errors[3]
    assert failure.value.outputs[:3] == expected
    assert failure.value.outputs[3] == []
    # The engine goes on serving after the failure.
    assert engine.generate(PROMPTS, greedy) == expected


def test_the_runner_never_sees_a_position_past_the_context(monkeypatch: pytest.MonkeyPatch) -> None:
    """The limits are checked once, at the rank's intake; after it the scheduler plans no
    position past the context length (a request reaching it finishes with "length"), so the
    runner checks nothing again."""
    engine = Engine(ServerArgs(model="tiny-llama", page_size=4, num_kv_pages=64, max_model_len=8))
    ends: list[int] = []
    forward = engine.runner.forward

    def spy(work, low_latency=None, extra_rows=None, bucket=None):  # type: ignore[no-untyped-def]
        ends.extend(c.end for c in work)
        return forward(work, low_latency, extra_rows, bucket)

    monkeypatch.setattr(engine.runner, "forward", spy)
    long = Request("long", [5, 6, 7, 8, 9, 10], SamplingParams(max_tokens=50))
    engine.run([long])
    assert long.finish_reason == "length" and len(long.output_token_ids) == 2
    assert max(ends) == 7  # the prompt at 0..5, one decode at 6; the 8th token is never fed


def test_logprobs_for_some_requests_of_a_batch_only() -> None:
    """A batch where one request asks for logprobs and its neighbour does not: each gets
    what it asked for (the scheduler used to look up logprobs for every request)."""
    engine = tiny_engine()
    asks = Request("asks", [5, 6, 7], SamplingParams(max_tokens=4, logprobs=2))
    plain = Request("plain", [8, 9], SamplingParams(max_tokens=4))
    engine.run([asks, plain])
    assert asks.finish_reason == plain.finish_reason == "length"
    assert len(asks.output_logprobs) == 4 and plain.output_logprobs == []
