"""The load generator of ``roundgate bench``: OpenAI streaming completions over HTTP.

Each request is a prompt of token ids of a given length, ``ignore_eos`` so it generates
exactly ``max_tokens``, optionally pinned to a DP rank (the vendor ``dp_rank`` field) to
reproduce skewed routing. Times are taken on the client, as a user would see them.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import httpx

from roundgate.sim.arrivals import Arrival


@dataclass
class RequestResult:
    """What one request saw."""

    prompt_tokens: int
    max_tokens: int
    dp_rank: int | None
    start_s: float = 0.0
    ttft_s: float | None = None
    e2e_s: float | None = None
    chunk_gaps_s: list[float] = field(default_factory=list)
    output_tokens: int = 0
    finish_reason: str | None = None
    error: str | None = None
    turn: int = 0  # a session's turn (0: its first, or not a session)
    session: int | None = None
    output_token_ids: list[int] = field(default_factory=list)  # with ``return_ids`` only

    @property
    def ok(self) -> bool:
        return self.error is None and self.e2e_s is not None


def prompt_ids(length: int, rng: random.Random, vocab: int = 256) -> list[int]:
    return [rng.randrange(vocab) for _ in range(length)]


async def one_request(
    client: httpx.AsyncClient,
    url: str,
    model: str,
    arrival: Arrival,
    ids: list[int],
    t0: float,
    api_key: str | None,
    return_ids: bool = False,
    user: str | None = None,
) -> RequestResult:
    res = RequestResult(
        arrival.prompt_tokens, arrival.output_tokens, arrival.rank, turn=arrival.turn
    )
    body = {
        "model": model,
        "prompt": ids,
        "max_tokens": arrival.output_tokens,
        "temperature": 0.0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if arrival.rank is not None:
        body["dp_rank"] = arrival.rank
    if return_ids:
        body["return_token_ids"] = True
    if user is not None:
        body["user"] = user
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    start = time.monotonic()
    res.start_s = start - t0
    last = None
    try:
        async with client.stream("POST", f"{url}/v1/completions", json=body, headers=headers) as r:
            if r.status_code != 200:
                res.error = f"HTTP {r.status_code}: {(await r.aread())[:200]!r}"
                return res
            async for line in r.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                event = json.loads(line[6:])
                if "error" in event:
                    res.error = event["error"].get("message", "error")
                    return res
                if event.get("usage"):
                    res.output_tokens = event["usage"]["completion_tokens"]
                for choice in event.get("choices", []):
                    res.output_token_ids += choice.get("token_ids") or []
                    now = time.monotonic()
                    if last is None:
                        res.ttft_s = now - start
                    else:
                        res.chunk_gaps_s.append(now - last)
                    last = now
                    if choice.get("finish_reason"):
                        res.finish_reason = choice["finish_reason"]
        res.e2e_s = time.monotonic() - start
    except (httpx.HTTPError, json.JSONDecodeError) as exc:
        res.error = f"{type(exc).__name__}: {exc}"
    return res


async def run_load(
    url: str,
    model: str,
    arrivals: Sequence[Arrival],
    concurrency: int | None,
    seed: int,
    api_key: str | None = None,
    on_done: Callable[[RequestResult], None] | None = None,
    timeout_s: float = 600.0,
) -> tuple[list[RequestResult], float]:
    """Open loop at the arrivals' times, or closed loop with ``concurrency`` workers."""
    rng = random.Random(seed)
    prompts = [prompt_ids(a.prompt_tokens, rng) for a in arrivals]
    limits = httpx.Limits(max_connections=max(concurrency or 0, 256))
    timeout = httpx.Timeout(timeout_s, connect=10.0)
    results: list[RequestResult | None] = [None] * len(arrivals)
    async with httpx.AsyncClient(limits=limits, timeout=timeout) as client:
        t0 = time.monotonic()

        async def fire(i: int) -> None:
            res = await one_request(client, url, model, arrivals[i], prompts[i], t0, api_key)
            results[i] = res
            if on_done:
                on_done(res)

        if concurrency:
            queue = list(range(len(arrivals)))[::-1]

            async def worker() -> None:
                while queue:
                    await fire(queue.pop())

            await asyncio.gather(*(worker() for _ in range(concurrency)))
        else:
            tasks = []
            for i, a in enumerate(arrivals):
                delay = a.time_s - (time.monotonic() - t0)
                if delay > 0:
                    await asyncio.sleep(delay)
                tasks.append(asyncio.create_task(fire(i)))
            await asyncio.gather(*tasks)
        duration = time.monotonic() - t0
    return [r for r in results if r is not None], duration
