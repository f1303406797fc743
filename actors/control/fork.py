"""``n > 1``: the sequences a request forks into once its prompt is computed.

The prompt is prefilled once, by the request itself (sequence 0). At its first sample the
executor samples the first token of sequences ``1..n-1`` from the same logits and saves a copy
of the prompt's KV for each; the scheduler then brings each in like a retracted request
(readmission allocates its own pages and the executor restores the copy), so a fork costs one
KV copy and no prefill tokens. Each sequence streams on the request's stream with its index.
"""

from __future__ import annotations

from roundgate.actors.control.request import Request, TokenLogprobs, sequence_id


def fork_sequences(
    parent: Request,
    firsts: tuple[int, ...],
    logprobs: dict[str, TokenLogprobs],
    max_sequence_len: int | None,
) -> list[tuple[Request, int, bool]]:
    """``(sequence, first token, finished)`` for sequences 1..n-1 of ``parent``, each with its
    prompt computed and its first token appended (which may already finish it)."""
    out = []
    for j, token in enumerate(firsts, start=1):
        child = Request(
            sequence_id(parent.request_id, j),
            parent.prompt_token_ids,
            parent.sampling.for_sequence(j),
            index=j,
            stream_id=parent.request_id,
            arrival_round=parent.arrival_round,
        )
        child.num_computed_tokens = parent.num_prompt_tokens
        if child.request_id in logprobs:
            child.output_logprobs.append(logprobs[child.request_id])
        out.append((child, token, child.append_token(token, max_sequence_len)))
    return out
