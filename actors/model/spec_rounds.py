"""A round's draft verification on the rank: which logits rows it needs, and the kept tokens.

A verify chunk feeds a request's last token and its ``d`` drafts in one forward; the forward
returns the logits at the chunk's last position like any chunk's, and the ``d`` earlier
positions come back as extra rows (``verify_rows``), the way prompt logprobs do.

Verification is exact-match against the target's own draw (``verify_drafts``): every
position is sampled by the rank's sampler as decoding without drafts would sample it (the
same transforms, the history including the drafts before it, the seeded draw of its output
index), and a draft is kept while it equals that token. The emitted tokens are therefore the
ones plain decoding would emit, greedy or seeded, logprobs included; an unseeded request's
tokens are each a draw from the target distribution. Drafts from prompt lookup are point
masses, and for a point mass this rule keeps a draft with probability ``p(draft)``, as
speculative sampling's rejection rule would (``roundgate.actors.model.spec_verify``).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import NamedTuple

import torch

from roundgate.actors.control.request import Request, TokenLogprobs
from roundgate.actors.control.round import RoundResult, ScheduledChunk
from roundgate.actors.model.round_sampling import history
from roundgate.actors.model.sampling import sample
from roundgate.actors.model.spec_verify import accept_greedy

logger = logging.getLogger("roundgate.runner")


class VerifyRows(NamedTuple):
    """The verify chunks of a round and where their earlier positions' rows are."""

    chunks: list[int]  # index of each verify chunk in the round's chunk list
    rows: list[int]  # flattened token index of every draft position, chunk by chunk


class Verdicts(NamedTuple):
    sampled: dict[str, int]  # the token after the kept drafts
    logprobs: dict[str, TokenLogprobs]
    accepted: dict[str, tuple[int, ...]]
    accepted_logprobs: dict[str, tuple[TokenLogprobs, ...]]

    def apply_to(self, result: RoundResult) -> None:
        """Put the verdicts in the round's result, beside the plain samples."""
        result.sampled.update(self.sampled)
        result.logprobs.update(self.logprobs)
        result.accepted = self.accepted
        result.accepted_logprobs = self.accepted_logprobs


def verify_rows(chunks: Sequence[ScheduledChunk]) -> VerifyRows | None:
    """The round's verify chunks (decodes carrying drafts), or None when there are none."""
    found: list[int] = []
    rows: list[int] = []
    offset = 0
    for i, (req, _, num_tokens, is_prefill) in enumerate(chunks):
        if not is_prefill and req.drafts:
            found.append(i)
            rows.extend(range(offset, offset + len(req.drafts)))
        offset += num_tokens
    return VerifyRows(found, rows) if found else None


def verify_round(
    logits: torch.Tensor,
    at: int,
    drafted: VerifyRows,
    chunks: Sequence[ScheduledChunk],
    generator: torch.Generator,
    failed: dict[str, str],
) -> Verdicts:
    """The round's verdicts from its logits (each chunk's last row, then the extra rows; the
    draft positions' start at ``at``). As with sampling, the batch is verified in one call,
    and only when that raises request by request: a request whose verification raises fails
    alone (``failed``)."""
    requests = [chunks[i].request for i in drafted.chunks]
    last = logits[drafted.chunks]
    earlier = logits[at:]
    try:
        return verify_drafts(last, earlier, requests, generator)
    except Exception:
        logger.exception("batched verification failed; verifying request by request")
    out = Verdicts({}, {}, {}, {})
    row = 0
    for i, req in enumerate(requests):
        d = len(req.drafts)
        try:
            one = verify_drafts(last[i : i + 1], earlier[row : row + d], [req], generator)
        except Exception as exc:
            failed[req.request_id] = f"sampling failed: {exc}"
        else:
            for mine, theirs in zip(out, one, strict=True):
                mine.update(theirs)
        row += d
    return out


def verify_drafts(
    last: torch.Tensor,
    earlier: torch.Tensor,
    requests: Sequence[Request],
    generator: torch.Generator,
) -> Verdicts:
    """Verify every request's drafts. ``last[i]``: request ``i``'s logits after its last
    draft; ``earlier``: the logits at its draft positions, request by request (``d_i`` rows
    each, as ``verify_rows`` lists them)."""
    rows: list[torch.Tensor] = []
    params = []
    indices: list[int] = []
    histories: list[tuple[list[int], list[int]]] = []
    needs_history = any(r.sampling.needs_history for r in requests)
    at = 0
    for i, req in enumerate(requests):
        d = len(req.drafts)
        rows.append(earlier[at : at + d])
        rows.append(last[i : i + 1])
        at += d
        base = len(req.output_token_ids) + req.num_resumed_tokens
        prompt, output = history(req) if needs_history else ([], [])
        for j in range(d + 1):
            params.append(req.sampling)
            indices.append(base + j)
            if needs_history:
                histories.append((prompt, output + list(req.drafts[:j])))
    logits = torch.cat(rows)
    tokens, token_logprobs = sample(
        logits, params, indices, generator, histories if needs_history else None
    )
    k = max(len(r.drafts) for r in requests)
    target = torch.full((len(requests), k + 1), -1, dtype=torch.int64)
    drafts = torch.full((len(requests), k), -1, dtype=torch.int64)
    at = 0
    for i, req in enumerate(requests):
        d = len(req.drafts)
        target[i, : d + 1] = torch.tensor(tokens[at : at + d + 1])
        drafts[i, :d] = torch.tensor(req.drafts)
        at += d + 1
    num_drafts = torch.tensor([len(r.drafts) for r in requests])
    kept = accept_greedy(target, drafts, num_drafts).num_accepted.tolist()
    out = Verdicts({}, {}, {}, {})
    at = 0
    for req, n in zip(requests, kept, strict=True):
        rid = req.request_id
        out.sampled[rid] = tokens[at + n]
        if n:
            out.accepted[rid] = tuple(req.drafts[:n])
        if req.sampling.logprobs is not None:
            out.logprobs[rid] = token_logprobs[at + n]
            if n:
                out.accepted_logprobs[rid] = tuple(token_logprobs[at : at + n])
        at += len(req.drafts) + 1
    return out
