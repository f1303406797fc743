"""Prompt counts refused before any parse, render or tokenize; preparation off the loop."""

from __future__ import annotations

import asyncio
import json
import threading
from typing import Any

import pytest
from ingress_fakes import make_ingress, make_request

from roundgate.deployment.ingress import Ingress
from roundgate.deployment.openai.chat_batch import create_batch_chat_completion
from roundgate.deployment.openai.completions import create_completion
from roundgate.deployment.openai.errors import APIError
from roundgate.deployment.openai.prepare import Preparer

CAP = 4  # max_prompts_per_request in these tests
TINY = [{"role": "user", "content": "hi"}]


class CountingTokenizer:
    """The ingress's tokenizer, every encode and render counted."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.calls = inner, 0

    def encode(self, *args: Any, **kwargs: Any) -> list[int]:
        self.calls += 1
        return self.inner.encode(*args, **kwargs)

    def render_chat(self, *args: Any, **kwargs: Any) -> list[int]:
        self.calls += 1
        return self.inner.render_chat(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def counting_ingress() -> tuple[Ingress, CountingTokenizer]:
    core, _ = make_ingress(max_prompts_per_request=CAP)
    core.tokenizer = CountingTokenizer(core.tokenizer)
    return core, core.tokenizer


def refusal(route: Any, core: Ingress, body: dict[str, Any]) -> APIError:
    with pytest.raises(APIError) as info:
        asyncio.run(route(core, make_request(json.dumps(body).encode())))
    return info.value


@pytest.mark.parametrize(
    ("route", "body", "param", "count"),
    [
        # One more conversation than the cap: refused before any is parsed or rendered.
        (create_batch_chat_completion, {"messages": [TINY] * (CAP + 1)}, "messages", CAP + 1),
        # A malformed conversation past the cap: the count is the refusal, not the parse.
        (
            create_batch_chat_completion,
            {"messages": [TINY] * CAP + [[{"role": "nobody"}]]},
            "messages",
            CAP + 1,
        ),
        # Completions: the prompts, and prompts x n, before any is tokenized.
        (create_completion, {"prompt": ["a"] * (CAP + 1)}, "prompt", CAP + 1),
        (create_completion, {"prompt": [[1, 2]] * (CAP + 1)}, "prompt", CAP + 1),
        (create_completion, {"prompt": ["a", "b", "c"], "n": 2}, "n", 3),
    ],
)
def test_prompt_counts_are_refused_before_any_render_or_tokenize(route, body, param, count):
    core, tokenizer = counting_ingress()
    exc = refusal(route, core, body)
    assert (exc.status, exc.param) == (400, param)
    assert f"{count} " in exc.message and f"at most {CAP} (max_prompts_per_request)" in exc.message
    assert tokenizer.calls == 0


@pytest.mark.parametrize(
    ("route", "body"),
    [
        (create_batch_chat_completion, {"messages": [TINY] * CAP, "max_tokens": 2}),
        (create_completion, {"prompt": ["a"] * CAP, "max_tokens": 2}),
    ],
)
def test_a_request_at_the_cap_is_prepared_and_served(route, body) -> None:
    core, tokenizer = counting_ingress()
    out = asyncio.run(route(core, make_request(json.dumps(body).encode())))
    assert len(out["choices"]) == CAP and tokenizer.calls == CAP


def test_the_preparer_runs_work_on_its_own_thread_and_returns_its_errors() -> None:
    preparer = Preparer(max_workers=1)

    async def run() -> tuple[str, str]:
        loop_thread = threading.current_thread().name
        worker = await preparer.run(lambda: threading.current_thread().name)
        with pytest.raises(APIError) as info:
            await preparer.run(_refuse, "messages")
        assert info.value.param == "messages"
        return loop_thread, worker

    loop_thread, worker = asyncio.run(run())
    preparer.close()
    assert worker != loop_thread and worker.startswith("roundgate-prepare")


def test_a_preparer_needs_a_worker() -> None:
    with pytest.raises(ValueError, match="max_workers"):
        Preparer(max_workers=0)


def _refuse(param: str) -> None:
    raise APIError(400, "refused", param=param)
