"""One round's sampling: the rows of the requests that sample, and the forks of ``n > 1``.

A request with ``sampling.n > 1`` is prefilled once; at its first sample its logits row is
repeated for sequences ``1..n-1``, each under its own sampling (``for_sequence``: its own
seeded stream), so the n first tokens come from one prompt forward.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import NamedTuple

import torch

from roundgate.actors.control.request import Request, TokenLogprobs, sequence_id
from roundgate.actors.model.grammar import Grammars
from roundgate.actors.model.sampling import sample

logger = logging.getLogger("roundgate.runner")


class RoundSamples(NamedTuple):
    sampled: dict[str, int]
    logprobs: dict[str, TokenLogprobs]  # by request id, forked sequences' ids included
    forks: dict[str, tuple[int, ...]]  # request id -> first tokens of sequences 1..n-1


def sample_round(
    logits: torch.Tensor,
    requests: Sequence[Request],
    generator: torch.Generator,
    grammars: Grammars | None = None,
) -> RoundSamples:
    """Sample one token per row of ``logits`` (row ``i`` is ``requests[i]``'s), plus the
    first token of every forked sequence; grammar rows are masked and their matchers fed."""
    rows = list(range(len(requests)))
    ids = [r.request_id for r in requests]
    params = [r.sampling for r in requests]
    # A continuation's index counts the output it resumed from (seeded draws, min_tokens).
    indices = [len(r.output_token_ids) + r.num_resumed_tokens for r in requests]
    owners = list(requests)
    forking = [r for r in requests if r.sampling.n > 1 and not r.output_token_ids]
    for row, r in enumerate(requests):
        if r.sampling.n > 1 and not r.output_token_ids:
            for j in range(1, r.sampling.n):
                rows.append(row)
                ids.append(sequence_id(r.request_id, j))
                params.append(r.sampling.for_sequence(j))
                indices.append(0)
                owners.append(r)
    if len(rows) > len(requests):
        logits = logits[torch.tensor(rows, device=logits.device)]
    # Penalties read the rows' tokens; the plain path builds no history at all.
    histories = [history(r) for r in owners] if any(p.needs_history for p in params) else None
    allowed = None
    if grammars is not None and any(p.grammar is not None for p in params):
        allowed = grammars.allowed(owners, logits.device)
    tokens, token_logprobs = sample(logits, params, indices, generator, histories, allowed)
    if allowed is not None:
        grammars.accept(requests, tokens[: len(requests)])
    sampled = dict(zip(ids[: len(requests)], tokens, strict=False))
    logprobs = {i: lp for i, lp in zip(ids, token_logprobs, strict=True) if lp is not None}
    forks: dict[str, tuple[int, ...]] = {}
    start = len(requests)
    for r in forking:
        forks[r.request_id] = tuple(tokens[start : start + r.sampling.n - 1])
        start += r.sampling.n - 1
    return RoundSamples(sampled, logprobs, forks)


def sample_each(
    logits: torch.Tensor,
    requests: Sequence[Request],
    generator: torch.Generator,
    grammars: Grammars | None,
    failed: dict[str, str],
) -> RoundSamples:
    """``sample_round``, where a request whose sampling raises fails alone (``failed``).

    The batch is sampled in one call; only when that raises are the rows sampled one by
    one, so the bad row is found and the others keep their tokens.
    """
    try:
        return sample_round(logits, requests, generator, grammars)
    except Exception:
        logger.exception("batched sampling failed; sampling row by row")
    out = RoundSamples({}, {}, {})
    for i, req in enumerate(requests):
        try:
            one = sample_round(logits[i : i + 1], [req], generator, grammars)
        except Exception as exc:
            failed[req.request_id] = f"sampling failed: {exc}"
            continue
        for mine, theirs in zip(out, one, strict=True):
            mine.update(theirs)
    return out


def history(request: Request) -> tuple[list[int], list[int]]:
    """The request's (prompt, output) ids for penalties; a continuation's resumed tokens are
    output (presence and frequency penalties count them)."""
    k = request.num_resumed_tokens
    if not k:
        return request.prompt_token_ids, request.output_token_ids
    prompt = request.prompt_token_ids
    return prompt[:-k], prompt[-k:] + request.output_token_ids
