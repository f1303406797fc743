"""vLLM's ``use_beam_search``: beam search of width ``n`` run by the ingress, one token per
step, over ordinary rank requests.

Each step asks every live beam's next-token distribution of the rank (a one-token request for
the top ``2 * width`` logprobs: the prefix cache holds the beam's earlier tokens, so only the
new token is prefilled), then keeps the ``width`` best extensions by cumulative logprob. An
extension by an end-of-sequence token ends that beam; at the end the finished and the live
beams are ranked by ``cumulative logprob / length ** length_penalty`` (the length counts the
prompt, as vLLM's and transformers' scores do) and the best ``width`` are the choices. The
rank stays a plain sampler: nothing about beams crosses the gather, so beam search costs the
group ordinary one-token requests and never a different round.

A request field that beam search would not honour (stop strings, penalties, a grammar,
logprobs, streaming, ...) is refused by name rather than ignored.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from roundgate.actors.control.messages import GenerateChunk, Usage
from roundgate.deployment.ingress import Ingress
from roundgate.deployment.openai.choices import Choice, Delta
from roundgate.deployment.openai.errors import APIError
from roundgate.deployment.openai.sampling import GenerateBody
from roundgate.deployment.openai.sse import drain

# Fields beam search honours (or that change nothing it returns); any other field a client
# sets to a value other than its default is refused when ``use_beam_search`` is true.
BEAM_FIELDS = frozenset(
    {
        "model", "prompt", "messages", "n", "max_tokens", "max_completion_tokens",
        "temperature", "seed", "ignore_eos", "length_penalty", "include_stop_str_in_output",
        "use_beam_search", "early_stopping", "skip_special_tokens",
        "spaces_between_special_tokens", "return_token_ids", "truncate_prompt_tokens",
        "truncation_side", "add_special_tokens", "add_generation_prompt",
        "continue_final_message", "chat_template_kwargs", "user", "dp_rank", "metadata",
        "request_id", "prompt_cache_key", "safety_identifier", "store", "service_tier",
        "min_characters", "stream",
    }
)  # fmt: skip


def check_beam_request(req: GenerateBody) -> None:
    """A 400 naming the first field set to something beam search would not honour."""
    if not req.use_beam_search:
        return
    if req.stream:
        raise APIError(400, "use_beam_search does not stream: send stream: false", "stream")
    for name in sorted(req.model_fields_set - BEAM_FIELDS):
        if getattr(req, name) != type(req).model_fields[name].default:
            raise APIError(
                400,
                f"{name} is not supported with use_beam_search (it would be ignored)",
                param=name,
            )


@dataclass(frozen=True)
class Beam:
    """One hypothesis: its generated tokens, their summed logprob, and ``"stop"`` once an
    end-of-sequence token ended it (the token itself is not kept)."""

    tokens: tuple[int, ...]
    logprob: float
    finish: str | None = None


def score(beam: Beam, prompt_len: int, length_penalty: float) -> float:
    """The ranking score: the summed logprob over the sequence's length (prompt included)
    raised to ``length_penalty``, so longer beams are not punished for their length alone."""
    return beam.logprob / ((prompt_len + len(beam.tokens)) ** length_penalty)


def next_beams(
    beams: list[Beam],
    candidates: list[list[tuple[int, float]]],
    width: int,
    stop_ids: frozenset[int],
) -> tuple[list[Beam], list[Beam]]:
    """One step: ``candidates[i]``, beam ``i``'s likeliest next tokens and their logprobs.
    Returns the ``width`` best live extensions and the beams an end-of-sequence token ended
    (every one among the candidates, as vLLM's). Ties keep the earlier beam and token."""
    live: list[Beam] = []
    ended: list[Beam] = []
    for beam, options in zip(beams, candidates, strict=True):
        for token, logprob in options:
            if not math.isfinite(logprob):
                continue
            if token in stop_ids:
                ended.append(Beam(beam.tokens, beam.logprob + logprob, "stop"))
            else:
                live.append(Beam((*beam.tokens, token), beam.logprob + logprob))
    order = sorted(range(len(live)), key=lambda i: -live[i].logprob)
    return [live[i] for i in order[:width]], ended


async def _candidates(
    core: Ingress, request_id: str, ids: list[int], step: Any, param: str
) -> list[tuple[int, float]]:
    """The rank's top ``2 * width`` next tokens after ``ids``: one one-token request."""
    choices, deltas = core.generate(request_id, ids, step, 1, param)
    await drain(deltas)
    logprobs = choices[0].logprobs
    if not logprobs:
        return []
    top = logprobs[0]
    return list(zip(top.top_ids, top.top_logprobs, strict=True))


async def search(
    core: Ingress,
    request_id: str,
    prompt: list[int],
    req: GenerateBody,
    max_tokens: int,
    param: str,
) -> list[Beam]:
    """The ``req.n`` best beams after ``prompt``, best first."""
    width = req.n
    # Each step's request: greedy, one token, the top 2 * width logprobs, nothing else.
    step = req.model_copy(
        update={
            "n": 1,
            "logprobs": 2 * width,
            "temperature": 0.0,
            "use_beam_search": False,
            "stream": False,
        }
    )
    if hasattr(step, "top_logprobs"):  # chat asks with logprobs: true and top_logprobs
        step = step.model_copy(update={"logprobs": True, "top_logprobs": 2 * width})
    stop_ids = frozenset() if req.ignore_eos else frozenset(core.eos_token_ids)
    beams, ended = [Beam((), 0.0)], []
    for t in range(max_tokens):
        room = core.max_model_len - len(prompt) - t
        if room < 1 or not beams:
            break
        candidates = await asyncio.gather(
            *(
                _candidates(core, f"{request_id}-s{t}b{i}", prompt + list(b.tokens), step, param)
                for i, b in enumerate(beams)
            )
        )
        beams, stopped = next_beams(beams, list(candidates), width, stop_ids)
        ended += stopped
    ranked = sorted(
        [*ended, *beams], key=lambda b: -score(b, len(prompt), req.length_penalty or 1.0)
    )
    return ranked[:width]


async def drained() -> AsyncIterator[Delta]:
    """The stream of a search that already ended: no deltas (the choices are whole)."""
    return
    yield


async def beam_search_choices(
    core: Ingress,
    request_id: str,
    prompts: list[list[int]],
    req: GenerateBody,
    max_tokens: int,
    param: str,
) -> list[Choice]:
    """Every prompt's ``n`` beams as finished choices (prompt ``p``'s from ``p * n``), their
    text detokenized as a generated choice's would be."""
    limit = core.app_args.max_logprobs
    limit = core.vocab_size if limit == -1 else min(limit, core.vocab_size)
    if 2 * req.n > limit:
        raise APIError(
            400,
            f"n={req.n}: beam search asks the rank for 2n top logprobs per step, more than "
            f"max_logprobs {limit}",
            param="n",
        )
    core.check_choices(len(prompts), req)
    for ids in prompts:
        core.check_vocab(ids, param, "prompt token id")
    results = await asyncio.gather(
        *(
            search(core, f"{request_id}-{p}", ids, req, max_tokens, param)
            for p, ids in enumerate(prompts)
        )
    )
    eos = core.eos_token_ids[0] if core.eos_token_ids else None
    choices = []
    for p, (ids, beams) in enumerate(zip(prompts, results, strict=True)):
        for j, beam in enumerate(beams):
            tokens = list(beam.tokens)
            if beam.finish == "stop" and req.include_stop_str_in_output and eos is not None:
                tokens.append(eos)
            choice = Choice(
                p * req.n + j,
                ids,
                core.tokenizer,
                counts_prompt=j == 0,
                skip_special_tokens=req.skip_special_tokens,
            )
            choice.feed(
                GenerateChunk(
                    token_ids=tuple(tokens),
                    finish_reason=beam.finish or "length",
                    usage=Usage(prompt_tokens=len(ids), completion_tokens=len(tokens)),
                )
            )
            choices.append(choice)
    return choices
