"""Small HTTP and rank-handle helpers shared by the integration tests."""

from __future__ import annotations

import functools
import json
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

import httpx

from roundgate.sim.sessions import SESSION_WORKLOADS

MIB = 1 << 20
COMPLETIONS = "/v1/completions"


def complete(url: str, **body: Any) -> dict[str, Any]:
    r = httpx.post(f"{url}/v1/completions", json=body, timeout=120)
    r.raise_for_status()
    return r.json()


def sse_events(response: httpx.Response) -> Iterator[dict[str, Any] | str]:
    for line in response.iter_lines():
        if line.startswith("data: "):
            data = line[len("data: ") :]
            yield data if data == "[DONE]" else json.loads(data)


class StreamNeverStarted(AssertionError):
    """``BackgroundStream.started.wait`` saw the stream end before its first chunk."""


class _Started:
    """``BackgroundStream.started``: set on the first chunk (an event without ``error``), never
    on failure. ``wait`` returns False on a timeout as ``threading.Event.wait`` does, but raises
    ``StreamNeverStarted`` with the stream's own error as soon as the stream ended unstarted, so
    a stream that fails at once fails the test at once instead of passing it."""

    def __init__(self, stream: BackgroundStream) -> None:
        self._event, self._stream = threading.Event(), stream

    def set(self) -> None:
        self._event.set()

    def is_set(self) -> bool:
        return self._event.is_set()

    def wait(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while not self._event.is_set():
            if self._stream.done.is_set():
                s = self._stream
                raise StreamNeverStarted(
                    f"the stream ended before its first chunk: error={s.error!r}, "
                    f"events={s.events[:3]!r}"
                )
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            self._event.wait(min(remaining, 0.05))
        return True


class StreamHTTPError(Exception):
    """The streaming request was answered with a non-200 status (the body says why)."""

    def __init__(self, status: int, body: str) -> None:
        super().__init__(f"HTTP {status}: {body[:2000]}")
        self.status, self.body = status, body


class BackgroundStream:
    """A streaming completion read in a thread; ``started`` fires on the first chunk only.

    A non-200 answer, a broken connection or any other failure lands in ``error`` (and ends
    the stream unstarted if it came first); an in-stream ``{"error": ...}`` event is kept in
    ``events`` for the test to read.
    """

    def __init__(self, url: str, **body: Any) -> None:
        self.url, self.body = url, {**body, "stream": True}
        self.done = threading.Event()
        self.started = _Started(self)
        self.events: list[Any] = []
        self.error: BaseException | None = None
        self.stop = threading.Event()
        self.finished_at: float | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            with (
                httpx.Client(timeout=httpx.Timeout(300, connect=10)) as client,
                client.stream("POST", f"{self.url}/v1/completions", json=self.body) as r,
            ):
                if r.status_code != 200:
                    raise StreamHTTPError(r.status_code, r.read().decode(errors="replace"))
                for event in sse_events(r):
                    self.events.append(event)
                    if isinstance(event, dict) and "error" not in event:
                        self.started.set()
                    if self.stop.is_set():
                        break  # closing the connection aborts the request
        except BaseException as exc:
            self.error = exc
        finally:
            self.finished_at = time.monotonic()
            self.done.set()

    def text(self) -> str:
        """The text streamed so far (every choice's, in arrival order)."""
        return "".join(
            c.get("text", "")
            for e in self.events
            if isinstance(e, dict) and "choices" in e
            for c in e["choices"]
        )

    def in_stream_errors(self) -> list[Any]:
        """The ``{"error": ...}`` events the server sent inside the stream."""
        return [e for e in self.events if isinstance(e, dict) and "error" in e]

    def close(self, timeout: float = 60) -> None:
        self.stop.set()
        self.done.wait(timeout)


class WaitTimeout(AssertionError):
    """``wait_for`` gave up: the message says what it waited for and what it last saw."""


def wait_for(
    probe: Callable[[], Any],
    timeout_s: float,
    what: str,
    *,
    until: Callable[[Any], Any] = bool,
    interval_s: float = 0.5,
    errors: tuple[type[Exception], ...] = (),
) -> Any:
    """Call ``probe()`` until ``until(value)`` holds and return that value.

    ``probe`` returns what it observed; an exception of a type in ``errors`` counts as "not
    yet" (and as what it saw). Past ``timeout_s`` it raises ``WaitTimeout`` naming ``what`` and
    the last observation, so a failure reads as the condition that never came.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            seen: Any = probe()
            if until(seen):
                return seen
        except errors as exc:
            seen = exc
        if time.monotonic() > deadline:
            last = repr(seen)
            if len(last) > 4000:
                last = last[:4000] + f"... ({len(last)} characters)"
            raise WaitTimeout(
                f"timed out after {timeout_s:.0f}s waiting for {what}; last saw {last}"
            )
        time.sleep(interval_s)


def wait_until(predicate: Any, timeout_s: float = 30.0, interval_s: float = 0.2) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError("condition not met in time")
        time.sleep(interval_s)


def rank_prompt_tokens(url: str, group: str | None = None) -> dict[int, float]:
    """Prompt tokens each dp rank admitted, from ``/metrics`` (``prefix_cache_queries``:
    counted at admission while prefix caching is on, the default); ``group``: that gang's
    series only (a redeployed gang's series linger a while)."""
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(f"{url}/metrics", timeout=30).raise_for_status().text
    tokens: dict[int, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name != "roundgate_prefix_cache_queries_total":
                continue
            if group is None or s.labels["group"] == group:
                rank = int(s.labels["dp_rank"])
                tokens[rank] = tokens.get(rank, 0.0) + s.value
    return tokens


def stream_tokens(ranks: Any, rank: int, prompt: list[int], max_tokens: int) -> list[int]:
    """Greedy tokens straight from one rank replica (no HTTP, no stop on EOS)."""
    from roundgate.actors.control.messages import GenerateRequest
    from roundgate.actors.control.request import SamplingParams

    message = GenerateRequest(
        request_id=f"direct-{rank}-{time.monotonic_ns()}",
        prompt_token_ids=tuple(prompt),
        sampling=SamplingParams(max_tokens=max_tokens, temperature=0.0),
        dp_rank=rank,
    )
    out: list[int] = []
    for chunk in ranks.options(stream=True).generate.remote(message):
        out.extend(chunk.token_ids)
    return out


def check_error_body(r: httpx.Response, status: int, code: str | None, param: str | None) -> None:
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/json")
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert isinstance(error["message"], str) and error["message"]
    if code is not None:
        assert error["code"] == code
    if param is not None:
        assert error["param"] == param


def check_still_serving(app) -> None:
    r = complete(app.url, prompt="still there?", max_tokens=2)
    assert r["choices"][0]["finish_reason"] in ("length", "stop")


def served_client(deployment: Any) -> Any:
    """The official ``openai`` client for a served deployment (no retries: a failure shows)."""
    import openai

    return openai.OpenAI(
        base_url=f"{deployment.url}/v1", api_key="unused", max_retries=0, timeout=300
    )


@functools.cache
def default_model_reference(model: str) -> Any:
    """transformers' model on the packaged GGUF the deployment serves (the reference), loaded
    once per session: a load takes seconds, and the served modules only read it."""
    import torch
    from transformers import AutoModelForCausalLM

    from roundgate.actors.model.gguf_file import packaged_path

    path = packaged_path(model)
    return AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32
    ).eval()


# Short multi-turn chat sessions for the served routing tests: a shared 48-token system prompt
# (three 16-token pages) and turns that resend the conversation, so later turns hit the cache.
SMALL_CHAT_SESSIONS = replace(
    SESSION_WORKLOADS["chat-sessions"],
    system_len=48,
    first_user_len=12,
    user_len=10,
    output_len=6,
    turns=3,
    think_s=0.05,
)


class Unary(threading.Thread):
    """A non-streaming completion in a thread; ``response`` or ``error`` once it ends."""

    def __init__(self, url: str, **body: Any) -> None:
        super().__init__(daemon=True)
        self.url, self.body = url, body
        self.response: httpx.Response | None = None
        self.error: BaseException | None = None
        self.start()

    def run(self) -> None:
        try:
            self.response = httpx.post(f"{self.url}/v1/completions", json=self.body, timeout=300)
        except BaseException as exc:
            self.error = exc
