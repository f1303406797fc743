"""Resumption at the ingress (``roundgate.deployment.resume``), with fake ranks that die mid-stream.

The fake ranks (``tests/ingress_fakes.py``) follow the rank's continuation contract: greedy
tokens depend on the whole context, seeded ones on ``(seed, output index)``, and the output
index and ``max_tokens`` count a continuation's resumed tokens. So a resumed request must
reproduce the uninterrupted one exactly; ``tests/test_resume_rank.py`` holds the real rank to
the same contract.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

import pytest
from ingress_fakes import Hang, dying_ingress, error_of, make_ingress, model_reply
from ray.exceptions import ActorDiedError, ActorUnavailableError, RayTaskError

from roundgate.actors.control.messages import GenerateChunk, GenerateRequest, Usage
from roundgate.actors.control.request import SamplingParams
from roundgate.actors.replica.rank_engine import GroupFailure, GroupUnavailable
from roundgate.actors.role import DisaggregationRole
from roundgate.deployment.ingress import Ingress
from roundgate.deployment.openai.choices import usage
from roundgate.deployment.openai.protocol import CompletionRequest, parse
from roundgate.deployment.resume import Continuation, ResumePolicy, attempt_id, shift_usage

DECODE = DisaggregationRole.DECODE
PREFILL = DisaggregationRole.PREFILL

PROMPT = [104, 105, 33]  # "hi!"
PD_INGRESS_ARGS = {
    "model": "tiny-moe",
    "device": "cpu",
    "max_model_len": 512,
    "prefill": {"dp_size": 1},
    "decode": {"dp_size": 1, "max_num_seqs": 4},
}


def died() -> ActorDiedError:
    return ActorDiedError()


def group_failed() -> BaseException:
    """What the ingress sees from a surviving rank: the rank's error wrapped by Ray."""
    return RayTaskError(
        "generate", "tb", GroupFailure("rank 0: DP group failed")
    ).as_instanceof_cause()


LOSSES = {
    "actor died": died,
    "actor unavailable": lambda: ActorUnavailableError("unreachable", None),
    "group failed": group_failed,
}


def run(core: Ingress, request_id: str = "req", **body: Any) -> tuple[list, list]:
    """A completion of ``PROMPT`` through ``core``: (choices, deltas)."""

    async def go() -> tuple[list, list]:
        req = parse(CompletionRequest, {"prompt": PROMPT, **body})
        choices, stream = core.generate_each(request_id, [PROMPT], req, req.max_tokens, "prompt")
        return choices, [d async for d in stream]

    return asyncio.run(go())


def uninterrupted(**body: Any) -> tuple[list, list]:
    return run(dying_ingress()[0], **body)


def resumed_count(core: Ingress, kind: str) -> float:
    return core.metrics.set.requests_resumed.labels(core.model_name, kind)._value.get()


@pytest.mark.parametrize("loss", list(LOSSES))
@pytest.mark.parametrize("cut", [1, 3, 7])
def test_a_stream_cut_by_a_rank_loss_goes_on_with_every_token_once(loss: str, cut: int) -> None:
    body = {"max_tokens": 12, "temperature": 0}
    want, _ = uninterrupted(**body)
    core, ranks = dying_ingress((cut, LOSSES[loss]()))
    choices, deltas = run(core, **body)
    got = choices[0]
    assert got.output_token_ids == want[0].output_token_ids
    assert [t for d in deltas for t in d.token_ids] == want[0].output_token_ids  # none twice
    assert "".join(d.text for d in deltas) == got.text == want[0].text
    assert got.finish_reason == "length"
    assert usage(choices) == {"prompt_tokens": 3, "completion_tokens": 12, "total_tokens": 15}
    first, second = ranks.payloads
    streamed = tuple(want[0].output_token_ids[:cut])
    assert second.prompt_token_ids == tuple(PROMPT) + streamed
    assert second.num_resumed_tokens == cut
    assert second.sampling == first.sampling  # max_tokens counts the resumed tokens on the rank
    assert second.request_id == attempt_id("req", 1) != first.request_id
    assert ranks.streams[0].cancelled
    assert resumed_count(core, "continued") == 1 and resumed_count(core, "rerouted") == 0


def test_a_seeded_stream_continues_with_the_same_draws_per_position() -> None:
    body = {"max_tokens": 10, "temperature": 1.0, "seed": 1234}
    want, _ = uninterrupted(**body)
    core, ranks = dying_ingress((4, died()), (2, group_failed()))
    choices, _ = run(core, **body)
    assert choices[0].output_token_ids == want[0].output_token_ids
    assert [p.num_resumed_tokens for p in ranks.payloads] == [0, 4, 6]
    assert {p.sampling.seed for p in ranks.payloads} == {1234}
    assert usage(choices)["completion_tokens"] == 10


def test_n_sequences_resume_apart_each_on_its_own_seeded_stream() -> None:
    body = {"max_tokens": 6, "temperature": 1.0, "seed": 7, "n": 2}
    want, _ = uninterrupted(**body)
    core, ranks = dying_ingress((5, died()))  # sequence 0 has 3 tokens, sequence 1 has 2
    choices, _ = run(core, **body)
    assert [c.output_token_ids for c in choices] == [c.output_token_ids for c in want]
    cont = sorted(ranks.payloads[1:], key=lambda p: p.request_id)
    assert [p.num_resumed_tokens for p in cont] == [3, 2]
    assert [p.sampling.n for p in cont] == [1, 1]
    assert [p.sampling.seed for p in cont] == [
        SamplingParams(seed=7, n=2).for_sequence(j).seed for j in (0, 1)
    ]
    assert usage(choices) == {"prompt_tokens": 3, "completion_tokens": 12, "total_tokens": 15}


def test_a_stop_string_spanning_the_break_is_found() -> None:
    body = {"max_tokens": 12, "temperature": 0}
    text = uninterrupted(**body)[0][0].text
    stop = text[2:6]  # starts with the 3rd token, which arrives before the rank dies
    assert text.find(stop) == 2
    core, _ = dying_ingress((3, died()))
    choices, deltas = run(core, stop=[stop], **body)
    assert (choices[0].text, choices[0].finish_reason) == (text[:2], "stop")
    assert "".join(d.text for d in deltas) == text[:2]  # no part of the stop was ever sent


def test_logprobs_and_their_text_offsets_continue() -> None:
    body = {"max_tokens": 8, "temperature": 0, "logprobs": 1}
    want, _ = uninterrupted(**body)
    core, _ = dying_ingress((3, died()))
    choices, deltas = run(core, **body)
    assert choices[0].logprobs == want[0].logprobs
    assert [lp.logprob for lp in choices[0].logprobs] == [-float(i) for i in range(8)]
    assert choices[0].text_offsets == want[0].text_offsets
    assert [lp for d in deltas for lp in d.logprobs] == want[0].logprobs


def test_a_request_lost_before_its_first_token_is_rerouted_whole() -> None:
    body = {"max_tokens": 5, "temperature": 0, "prompt_logprobs": 1}
    want, _ = uninterrupted(**body)
    core, ranks = dying_ingress((0, died()))
    choices, _ = run(core, **body)
    assert choices[0].output_token_ids == want[0].output_token_ids
    assert choices[0].prompt_logprobs == want[0].prompt_logprobs  # asked of the second rank
    first, second = ranks.payloads
    assert replace(second, request_id=first.request_id) == first
    assert resumed_count(core, "rerouted") == 1 and resumed_count(core, "continued") == 0


def test_a_continuation_does_not_ask_for_prompt_logprobs_again() -> None:
    core, ranks = dying_ingress((2, died()))
    choices, _ = run(core, max_tokens=5, temperature=0, prompt_logprobs=1)
    assert ranks.payloads[0].sampling.prompt_logprobs == 1
    assert ranks.payloads[1].sampling.prompt_logprobs is None
    assert len(choices[0].prompt_logprobs) == len(PROMPT) - 1  # the original prompt's, once


@pytest.mark.parametrize("limit", [0, 1, 3])
def test_rank_losses_are_bounded_per_request(limit: int) -> None:
    """A request whose ranks keep dying ends with a clear error after ``limit`` resumptions:
    one that brings every rank it lands on down cannot take the group down one by one."""
    core, ranks = dying_ingress(*[(1, died())] * 10)
    core.resume_policy = ResumePolicy(max_rank_failures=limit, first_backoff_s=0, max_backoff_s=0)
    exc = error_of(lambda: run(core, max_tokens=20, temperature=0))
    assert len(ranks.payloads) == limit + 1
    assert exc.status == 503 and exc.headers["Retry-After"]
    if limit:
        assert exc.code == "resume_limit_reached"
        assert f"failed {limit + 1} times" in exc.message
    else:  # resumption off (P/D): the first loss is the client's error, as before
        assert exc.code == "group_unavailable"


def test_a_rank_that_refuses_because_its_group_already_failed_is_not_charged() -> None:
    """Resubmitted while the failed group is still tearing down: its ranks refuse at once
    (``GroupUnavailable``), which says nothing about this request, so only real losses count."""
    refused = [(0, GroupUnavailable("rank 0: DP group failed")) for _ in range(5)]
    core, ranks = dying_ingress((2, died()), *refused, (1, died()))
    core.resume_policy = ResumePolicy(max_rank_failures=2, first_backoff_s=0, max_backoff_s=0)
    want, _ = uninterrupted(max_tokens=6, temperature=0)
    choices, _ = run(core, max_tokens=6, temperature=0)
    assert choices[0].output_token_ids == want[0].output_token_ids
    assert len(ranks.payloads) == 8
    assert resumed_count(core, "continued") == 2  # the refusals are not resumptions


def test_a_pinned_request_resumes_on_its_rank() -> None:
    core, ranks = dying_ingress((2, died()))
    choices, _ = run(core, max_tokens=5, temperature=0, dp_rank=1)
    assert choices[0].finish_reason == "length"
    assert [p.dp_rank for p in ranks.payloads] == [1, 1]


def test_a_pinned_rank_that_never_comes_back_ends_the_request_naming_it() -> None:
    core, ranks = dying_ingress((2, died()), (0, Hang()))
    core.resume_policy = ResumePolicy(resume_timeout_s=0.2, first_backoff_s=0, max_backoff_s=0)
    exc = error_of(lambda: run(core, max_tokens=5, temperature=0, dp_rank=1))
    assert (exc.status, exc.code) == (503, "resume_timed_out")
    assert "dp_rank 1" in exc.message and "2 tokens streamed" in exc.message
    assert ranks.streams[1].cancelled


def test_what_a_client_causes_is_never_resumed() -> None:
    """A rank's refusal of this request (an error chunk) and a failure that is not a rank loss
    end the request as before: only the rank handle's loss errors resubmit anything."""
    refusal = GenerateChunk(
        token_ids=(),
        finish_reason="error",
        usage=Usage(prompt_tokens=3, completion_tokens=0),
        error="grammar does not compile",
    )
    core, ranks = make_ingress(lambda m: [refusal])
    exc = error_of(lambda: run(core, max_tokens=5))
    assert exc.status == 400 and len(ranks.payloads) == 1
    core, ranks = make_ingress(lambda m: [*model_reply(m)[:2], RuntimeError("bug")])
    exc = error_of(lambda: run(core, max_tokens=5))
    assert exc.code == "group_unavailable" and len(ranks.payloads) == 1


def pd_roles(lose: list[Any]) -> tuple[Ingress, Any, Any]:
    """A P/D ingress whose decode calls stream ``model_reply`` of the handoff (resumed tokens
    included) after a transfer report; call ``i`` first meets ``lose[i]`` if given: an error
    raised after that many chunks, or ``"source"`` for a report that the prefill process
    holding the pages is gone."""
    from ingress_fakes import FakeStream
    from test_pd_ingress import FakeRole, handoff_of

    from roundgate.actors.replica.pd_messages import PrefillResult, TransferReport

    ok = TransferReport(decode_wait_s=0.0, transfer_s=0.0, num_pages=1, num_bytes=1)
    calls = iter(lose)

    def prefill(m: GenerateRequest) -> PrefillResult:
        handoff = replace(handoff_of(m), num_resumed_tokens=m.num_resumed_tokens)
        return PrefillResult(handoff=handoff, source_incarnation="p")

    def decode(request: Any) -> FakeStream:
        h = request.handoff
        message = GenerateRequest(
            request_id=h.request_id,
            prompt_token_ids=h.prompt_token_ids,
            sampling=h.sampling,
            num_resumed_tokens=h.num_resumed_tokens,
        )
        how = next(calls, None)
        if how == "source":
            lost = replace(ok, error="prefill rank 0 restarted", source_lost=True)
            return FakeStream([lost, tokens_error(len(h.prompt_token_ids))])
        chunks = [ok, *model_reply(message)]
        if how is not None:
            chunks = [*chunks[: 1 + how], died()]
        return FakeStream(chunks)

    prefill_role = FakeRole(prefill=prefill, release_handoff=lambda m: None)
    decode_role = FakeRole(decode=decode)
    core = Ingress(PD_INGRESS_ARGS, {PREFILL: prefill_role, DECODE: decode_role})
    return core, prefill_role, decode_role


def tokens_error(prompt: int) -> GenerateChunk:
    return GenerateChunk(
        token_ids=(),
        finish_reason="error",
        usage=Usage(prompt_tokens=prompt, completion_tokens=0),
        error="KV transfer failed",
    )


def test_a_pd_stream_goes_on_after_its_decode_rank_dies() -> None:
    """The decode rank dies after three tokens: the continuation (prompt and the three tokens,
    flagged resumed) is prefilled again, its handoff carries the resumed count to a decode
    rank, and the client gets the uninterrupted run's tokens, each once."""
    fused, _ = make_ingress(model_reply)
    want, _ = run(fused, max_tokens=8, seed=3, temperature=0.9)
    core, prefill, decode = pd_roles([3])
    choices, _ = run(core, max_tokens=8, seed=3, temperature=0.9)
    assert choices[0].output_token_ids == want[0].output_token_ids
    first, again = prefill.prefill.messages
    assert again.num_resumed_tokens == 3
    assert again.prompt_token_ids == (*first.prompt_token_ids, *want[0].output_token_ids[:3])
    assert decode.decode.messages[1].handoff.num_resumed_tokens == 3
    assert usage(choices) == {"prompt_tokens": 3, "completion_tokens": 8, "total_tokens": 11}


def test_a_pd_prompt_whose_prefill_process_died_is_prefilled_again() -> None:
    """The decode rank reports the prefill process that held the pages gone (its rank
    restarted): no token had reached the client, so the request is prefilled again whole."""
    fused, _ = make_ingress(model_reply)
    want, _ = run(fused, max_tokens=6)
    core, prefill, _ = pd_roles(["source"])
    choices, _ = run(core, max_tokens=6)
    assert choices[0].output_token_ids == want[0].output_token_ids
    first, again = prefill.prefill.messages
    assert again.num_resumed_tokens == 0 and again.prompt_token_ids == first.prompt_token_ids
    assert again.request_id == attempt_id(first.request_id, 1)


# ---- the pure parts -----------------------------------------------------------------------


def message(**sampling: Any) -> GenerateRequest:
    return GenerateRequest(
        request_id="r",
        prompt_token_ids=(1, 2),
        sampling=SamplingParams(**{"max_tokens": 8, **sampling}),
        dp_rank=1,
    )


def test_a_continuation_carries_everything_but_the_tokens_it_already_has() -> None:
    original = message(seed=5, grammar=("json_object", ""), logprobs=2, min_tokens=6)
    cont = Continuation(original, 0, (7, 8, 9)).message(2)
    assert cont.prompt_token_ids == (1, 2, 7, 8, 9)
    assert cont.num_resumed_tokens == 3
    assert cont.sampling == original.sampling  # seed, grammar, min/max tokens: the rank offsets
    assert (cont.dp_rank, cont.request_id) == (1, "r-r2")
    assert Continuation(original, 0, (7,)).num_remaining_tokens == 7


@pytest.mark.parametrize(
    ("sequence", "output", "error"),
    [(2, (), "sequence 2 of a request with n=1"), (0, tuple(range(8)), "leaves nothing")],
)
def test_a_continuation_refuses_what_cannot_be_resumed(sequence, output, error) -> None:
    with pytest.raises(ValueError, match=error):
        Continuation(message(), sequence, output)


def test_usage_moves_the_resumed_tokens_back_to_the_completion() -> None:
    chunk = GenerateChunk(
        token_ids=(4,), finish_reason=None, usage=Usage(prompt_tokens=7, completion_tokens=2)
    )
    assert shift_usage(chunk, 5).usage == Usage(prompt_tokens=2, completion_tokens=7)
    assert shift_usage(chunk, 0) is chunk


@pytest.mark.parametrize(
    ("field", "value"),
    [("max_rank_failures", -1), ("resume_timeout_s", 0), ("first_backoff_s", 9)],
)
def test_policy_refuses_bad_values_naming_them(field: str, value: float) -> None:
    with pytest.raises(ValueError, match=field):
        ResumePolicy(**{field: value})


def test_resubmissions_back_off_doubling_until_a_chunk_arrives(monkeypatch) -> None:
    """A group still tearing down refuses at once; it is asked again after 0.25, 0.5, 1 s..."""
    waits: list[float] = []

    async def sleep(seconds: float) -> None:
        if seconds:  # the fake streams yield with sleep(0) between chunks
            waits.append(seconds)

    monkeypatch.setattr(asyncio, "sleep", sleep)
    refused = [(0, GroupUnavailable("rank 0: DP group failed")) for _ in range(4)]
    core, _ = dying_ingress((2, died()), *refused, (3, died()), (0, GroupUnavailable("again")))
    core.resume_policy = ResumePolicy(first_backoff_s=0.25, max_backoff_s=1.0)
    choices, _ = run(core, max_tokens=8, temperature=0)
    assert choices[0].finish_reason == "length"
    assert waits == [0.25, 0.5, 1.0, 1.0, 1.0, 0.25, 0.5]


def test_the_client_stream_has_no_error_event_and_counts_usage_once() -> None:
    """Over the OpenAI stream itself: the chunks of both attempts, then one usage, then [DONE]."""
    import json

    from ingress_fakes import make_request

    from roundgate.deployment.openai.completions import create_completion

    body = {
        "prompt": PROMPT,
        "max_tokens": 9,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    want = uninterrupted(max_tokens=9, temperature=0)[0][0]
    core, _ = dying_ingress((4, died()))

    async def go() -> list[Any]:
        response = await create_completion(core, make_request(json.dumps(body).encode()))
        return [line async for line in response.body_iterator]

    events = [e[len("data: ") :].strip() for e in asyncio.run(go())]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert not [c for c in chunks if "error" in c]
    assert "".join(ch["text"] for c in chunks for ch in c["choices"]) == want.text
    assert [c["usage"] for c in chunks if c.get("usage")] == [
        {"prompt_tokens": 3, "completion_tokens": 9, "total_tokens": 12}
    ]
