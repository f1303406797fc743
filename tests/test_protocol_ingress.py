"""The ingress on a fake rank handle: up-front request checks, auth, generation, the 503 window."""

from __future__ import annotations

from typing import Any

import pytest
from ingress_fakes import (
    CONTEXT,
    complete,
    echo_reply,
    error_of,
    make_ingress,
    make_request,
    tokens,
)

from roundgate.actors.control.messages import GenerateChunk, GenerateRequest, Usage
from roundgate.actors.control.request import SamplingParams
from roundgate.actors.model.tokenizer import ByteTokenizer
from roundgate.deployment import ingress
from roundgate.deployment.openai.choices import Choice, usage
from roundgate.deployment.openai.protocol import CompletionRequest, parse

# ---- request checks ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "status", "param", "code"),
    [
        ({"prompt": ""}, 400, "prompt", None),
        ({"prompt": []}, 400, "prompt", None),
        ({"prompt": [[]]}, 400, "prompt", None),
        ({"prompt": [512]}, 400, "prompt", None),  # outside the model's vocabulary (512 rows)
        ({"prompt": [-1, 5]}, 400, "prompt", None),
        ({"prompt": [2**40]}, 400, "prompt", None),
        ({"prompt": [1] * CONTEXT}, 400, "prompt", "context_length_exceeded"),
        ({"prompt": "a" * (CONTEXT + 5)}, 400, "prompt", "context_length_exceeded"),
        ({"prompt": "ab", "max_tokens": CONTEXT - 1}, 400, "max_tokens", "context_length_exceeded"),
        ({"prompt": "a", "n": 65}, 400, "n", None),
        ({"prompt": ["a"] * 65, "n": 4}, 400, "n", None),  # 260 choices > the 256 cap
        ({"prompt": "a", "dp_rank": 2}, 400, "dp_rank", None),
    ],
)
def test_requests_the_ranks_cannot_serve_are_refused_up_front(body, status, param, code):
    core, ranks = make_ingress()
    exc = error_of(lambda: complete(core, **body))
    assert (exc.status, exc.param, exc.code) == (status, param, code)
    assert ranks.payloads == [], "a refused request must not reach a rank"


def test_max_tokens_fill_the_context_exactly() -> None:
    core, ranks = make_ingress()
    choices, _ = complete(core, prompt="ab", max_tokens=CONTEXT - 2)
    assert ranks.payloads[0].sampling.max_tokens == CONTEXT - 2
    assert choices[0].finish_reason == "length"


@pytest.mark.parametrize(
    ("headers", "ok"),
    [({}, False), ({"authorization": "Bearer nope"}, False), ({"authorization": "Bearer k"}, True)],
)
def test_api_key(headers: dict[str, str], ok: bool) -> None:
    core, _ = make_ingress(api_key="k")
    if ok:
        core.check_auth(make_request(b"", headers))
    else:
        exc = error_of(lambda: core.check_auth(make_request(b"", headers)))
        assert (exc.status, exc.code) == (401, "invalid_api_key")


def test_unknown_model_is_404() -> None:
    core, _ = make_ingress()
    core.check_model(None)
    core.check_model("tiny-moe")
    exc = error_of(lambda: core.check_model("gpt-5"))
    assert (exc.status, exc.code, exc.param) == (404, "model_not_found", "model")


# ---- generation ----------------------------------------------------------------------------


def test_choices_stream_text_and_count_tokens() -> None:
    core, ranks = make_ingress()
    choices, deltas = complete(core, prompt=["Hi", "Yo"], max_tokens=3, ignore_eos=True)
    assert [c.text for c in choices] == ["Haa", "Yaa"]
    assert [c.output_token_ids for c in choices] == [[72, 97, 97], [89, 97, 97]]
    assert usage(choices) == {
        "prompt_tokens": 4,
        "completion_tokens": 6,
        "total_tokens": 10,
    }
    assert sorted(d.finish_reason for d in deltas if d.finish_reason) == ["length", "length"]
    assert all(s.sampling.stop_token_ids == () for s in ranks.payloads)


@pytest.mark.parametrize(
    ("prompt", "dp_rank", "ids"),
    [("Hi", None, ["abc"]), (["Hi", "Yo", "Ok"], 1, ["abc-0", "abc-1", "abc-2"])],
)
def test_each_choice_is_one_typed_request_under_the_response_id(
    prompt: str | list[str], dp_rank: int | None, ids: list[str]
) -> None:
    core, ranks = make_ingress()
    complete(core, request_id="abc", prompt=prompt, max_tokens=3, dp_rank=dp_rank)
    assert sorted(m.request_id for m in ranks.payloads) == ids
    texts = [prompt] if isinstance(prompt, str) else prompt
    by_id = {m.request_id: m for m in ranks.payloads}
    for rid, text in zip(ids, texts, strict=True):
        message = by_id[rid]
        assert message.prompt_token_ids == tuple(core.tokenizer.encode(text))
        assert message.dp_rank == dp_rank
        assert message.sampling == SamplingParams(
            max_tokens=3, temperature=1.0, stop_token_ids=(core.tokenizer.eos_token_id,)
        )
        assert message.to_request().request_id == rid


def test_sampling_is_built_once_and_fills_the_context_when_unset() -> None:
    core, _ = make_ingress()
    req = parse(CompletionRequest, {"prompt": "ab", "temperature": 0.5, "top_k": -1, "seed": 3})
    sampling = core.sampling_of(req, 2, "prompt", None)
    assert sampling == SamplingParams(
        max_tokens=CONTEXT - 2,
        temperature=0.5,
        top_k=0,
        seed=3,
        stop_token_ids=(core.tokenizer.eos_token_id,),
    )


def test_usage_adds_up_the_ranks_counts() -> None:
    tok = ByteTokenizer()
    counted = Choice(0, [1, 2], tok)
    counted.feed(
        GenerateChunk(
            token_ids=(5, 6, 7),
            finish_reason=None,
            usage=Usage(prompt_tokens=2, completion_tokens=3),
        )
    )
    # The rank's count wins over the tokens this choice happened to receive.
    behind = Choice(1, [1, 2, 3], tok)
    behind.feed(
        GenerateChunk(
            token_ids=(5,), finish_reason=None, usage=Usage(prompt_tokens=3, completion_tokens=2)
        )
    )
    unanswered = Choice(2, [1, 2, 3, 4], tok)  # no chunk yet: its prompt, nothing generated
    assert usage([counted, behind, unanswered]) == {
        "prompt_tokens": 9,
        "completion_tokens": 5,
        "total_tokens": 14,
    }


def test_eos_is_a_stop_token_unless_ignored() -> None:
    core, ranks = make_ingress()
    complete(core, prompt="a", max_tokens=2)
    assert ranks.payloads[0].sampling.stop_token_ids == (core.tokenizer.eos_token_id,)


def test_stop_string_cuts_the_text_and_cancels_the_rank_stream() -> None:
    core, ranks = make_ingress()
    choices, _ = complete(core, prompt="x", max_tokens=6, stop=["aa"])
    assert (choices[0].text, choices[0].finish_reason) == ("x", "stop")
    assert ranks.streams[0].cancelled


def test_a_failed_group_answers_503_with_retry_after_then_recovers(monkeypatch) -> None:
    clock = [100.0]
    monkeypatch.setattr(ingress, "time", type("Clock", (), {"monotonic": lambda: clock[0]}))
    dead = [True]

    def reply(message: GenerateRequest) -> list[Any]:
        if dead[0]:
            return [tokens(65), RuntimeError("rank 1: DP group failed")]
        return echo_reply(message)

    core, _ = make_ingress(reply)
    exc = error_of(lambda: complete(core, prompt="a", max_tokens=3))
    assert (exc.status, exc.code) == (503, "group_unavailable")
    assert exc.headers == {"Retry-After": str(ingress.RETRY_AFTER_S)}

    dead[0] = False  # the gang restarts; until the window passes, callers are told to retry
    for check in (lambda: complete(core, prompt="a", max_tokens=3), core.check_available):
        exc = error_of(check)
        assert (exc.status, exc.code) == (503, "group_restarting")
        assert exc.headers["Retry-After"] == str(ingress.RETRY_AFTER_S)

    clock[0] += ingress.RETRY_AFTER_S + 0.1
    choices, _ = complete(core, prompt="a", max_tokens=3)
    assert choices[0].finish_reason == "length"


def test_prompts_per_request_are_capped() -> None:
    core, ranks = make_ingress(max_prompts_per_request=3)
    exc = error_of(lambda: complete(core, prompt=["a", "b", "c", "d"]))
    assert (exc.status, exc.param) == (400, "prompt") and "at most 3" in exc.message
    assert ranks.payloads == []


@pytest.mark.parametrize("status", [400, 500])
def test_a_request_the_rank_failed_alone_gets_its_status_and_the_group_stays_up(status) -> None:
    def reply(message: GenerateRequest) -> list[Any]:
        if message.prompt_token_ids[0] == ord("x"):
            error = GenerateChunk(
                token_ids=(),
                finish_reason="error",
                usage=Usage(prompt_tokens=1, completion_tokens=1),
                error="sampling failed: nan",
                error_status=status,
            )
            return [tokens(65), error]
        return echo_reply(message)

    core, _ = make_ingress(reply)
    exc = error_of(lambda: complete(core, prompt="x", max_tokens=3))
    assert exc.status == status and "sampling failed: nan" in exc.message
    assert exc.type == ("server_error" if status == 500 else "invalid_request_error")
    choices, _ = complete(core, prompt="a", max_tokens=3)  # no 503 window: the group is fine
    assert choices[0].finish_reason == "length"
