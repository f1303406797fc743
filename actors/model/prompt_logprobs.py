"""Prompt logprobs: the model's log-probability of each prompt token, read off the prefill.

Position ``p`` of a prompt predicts token ``p + 1``, so a prefill chunk covering positions
``[start, end)`` scores prompt tokens ``start + 1 .. min(end, P - 1)`` (``P`` the prompt
length; the last position predicts the first output token, which sampling reports). The
first prompt token has no logprob. The rows are found only for chunks whose request asked
(``sampling.prompt_logprobs``), so a round without such a request adds no logits and no
work beyond one scan of its prefill chunks.

Numbers are the raw model distribution (``log_softmax`` of the logits, as the sampled tokens'
logprobs), with each token's rank (1: the likeliest) and the top ``k`` alternatives.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch

from roundgate.actors.control.request import TokenLogprobs
from roundgate.actors.control.round import ScheduledChunk

# Rows scored per log_softmax call: bounds the float32 temporaries to ~rows x vocab.
_SLICE_ROWS = 256


class PromptRows(NamedTuple):
    """Where the asked-for prompt positions sit in a round's flattened batch."""

    rows: list[int]  # flattened token index of each scored position
    targets: list[int]  # the prompt token each position predicts
    owners: list[tuple[str, int, int, int]]  # (request id, first row, row count, k)
    top_k: int  # the largest k any of them asked for


def prompt_rows(chunks: Sequence[ScheduledChunk]) -> PromptRows | None:
    """The positions to score this round, or None when no chunk's request asked."""
    rows: list[int] = []
    targets: list[int] = []
    owners: list[tuple[str, int, int, int]] = []
    top_k = 0
    offset = 0
    for req, start, num_tokens, is_prefill in chunks:
        k = req.sampling.prompt_logprobs
        if is_prefill and k is not None:
            stop = min(start + num_tokens, req.num_prompt_tokens - 1)
            if stop > start:
                owners.append((req.request_id, len(rows), stop - start, k))
                rows.extend(range(offset, offset + stop - start))
                targets.extend(req.prompt_token_ids[start + 1 : stop + 1])
                top_k = max(top_k, k)
        offset += num_tokens
    if not owners:
        return None
    return PromptRows(rows, targets, owners, top_k)


def score_rows(logits: torch.Tensor, found: PromptRows) -> dict[str, list[TokenLogprobs]]:
    """Each owner's entries from ``logits`` (``[len(found.rows), vocab]``, row order)."""
    targets = torch.tensor(found.targets, device=logits.device)
    chosen: list[float] = []
    ranks: list[int] = []
    tops_lp: list[list[float]] = []
    tops_id: list[list[int]] = []
    for first in range(0, logits.shape[0], _SLICE_ROWS):
        logp = torch.log_softmax(logits[first : first + _SLICE_ROWS].float(), dim=-1)
        target = targets[first : first + _SLICE_ROWS, None]
        value = logp.gather(1, target)
        chosen += value.squeeze(1).tolist()
        ranks += ((logp > value).sum(dim=-1) + 1).tolist()
        if found.top_k:
            top_lp, top_ids = logp.topk(found.top_k, dim=-1)
            tops_lp += top_lp.tolist()
            tops_id += top_ids.tolist()
    out: dict[str, list[TokenLogprobs]] = {}
    for request_id, first, count, k in found.owners:
        out[request_id] = [
            TokenLogprobs(
                chosen[i],
                tuple(tops_id[i][:k]) if k else (),
                tuple(tops_lp[i][:k]) if k else (),
                ranks[i],
            )
            for i in range(first, first + count)
        ]
    return out
