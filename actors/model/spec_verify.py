"""Verifying draft tokens: which of a request's ``k`` drafts the target model keeps.

One forward of the target over the request's last token and its drafts gives ``k + 1``
next-token distributions: position ``j`` is the target's distribution after the prefix and
drafts ``0..j-1``. Every verification emits the accepted drafts plus one token of the
target's own, so a round yields between 1 and ``k + 1`` tokens per request.

- **Greedy** (``accept_greedy``): draft ``j`` is kept while it equals the target's argmax at
  ``j``; the emitted tokens are then exactly the target's argmaxes up to and including the
  first disagreement, which is what decoding without drafts would have produced, token for
  token.
- **Sampling** (``accept_rejection``): speculative sampling's rejection rule (Leviathan et
  al. 2023; Chen et al. 2023). Draft ``j``, drawn from the draft's ``q_j``, is kept with
  probability ``min(1, p_j(d) / q_j(d))``; at the first rejection a token is drawn from the
  residual ``max(0, p_j - q_j)`` renormalized, and if every draft was kept, one more from
  ``p_k``. Each emitted token is then distributed exactly as ``p`` at its position. A draft
  that is a point mass (n-gram, a greedy draft model: ``draft_probs`` None) is kept with
  probability ``p_j(d)`` and the residual is ``p_j`` without ``d``.

The randomness comes in as arguments (a uniform per draft, exponential noise per position
for the draws, as ``roundgate.actors.model.sampling``'s race draws), so a seeded request takes
them from generators seeded by its seed and output index (``spec_noise``) and its run is
reproducible whatever else shares the batch.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from roundgate.actors.model.sampling import seeded_generator


class Verified(NamedTuple):
    """Per request: how many drafts were kept, and the emitted tokens (``num_accepted + 1``
    of them valid, left-aligned in a ``[B, k + 1]`` tensor; the rest is padding, -1)."""

    num_accepted: torch.Tensor
    tokens: torch.Tensor


def _first_reject(keep: torch.Tensor, num_drafts: torch.Tensor) -> torch.Tensor:
    """Per row, the index of the first draft not kept (``num_drafts`` when all were)."""
    k = keep.shape[1]
    positions = torch.arange(k, device=keep.device)[None, :]
    keep = keep & (positions < num_drafts[:, None])
    # cumprod of kept flags: 1 while every draft so far was kept.
    return keep.to(torch.int64).cumprod(dim=1).sum(dim=1)


def _emit(
    drafts: torch.Tensor, num_accepted: torch.Tensor, last: torch.Tensor, width: int
) -> torch.Tensor:
    """``drafts[:n] + [last]`` per row, padded with -1 to ``width``."""
    batch = drafts.shape[0]
    out = torch.full((batch, width), -1, dtype=torch.int64, device=drafts.device)
    positions = torch.arange(width, device=drafts.device)[None, :]
    padded = torch.cat([drafts.to(torch.int64), out[:, :1]], dim=1)
    out = torch.where(positions < num_accepted[:, None], padded[:, :width], out)
    return out.scatter(1, num_accepted[:, None], last[:, None])


def accept_greedy(
    target_tokens: torch.Tensor, drafts: torch.Tensor, num_drafts: torch.Tensor
) -> Verified:
    """Greedy verification. ``target_tokens``: ``[B, k + 1]``, the target's argmax at each
    position; ``drafts``: ``[B, k]``; ``num_drafts``: ``[B]``, how many of each row's drafts
    are real (a request may have fewer than ``k``, or none)."""
    k = drafts.shape[1]
    if target_tokens.shape != (drafts.shape[0], k + 1):
        raise ValueError(
            f"target_tokens {tuple(target_tokens.shape)} for drafts {tuple(drafts.shape)}"
        )
    num_accepted = _first_reject(drafts == target_tokens[:, :k], num_drafts)
    last = target_tokens.gather(1, num_accepted[:, None]).squeeze(1)
    return Verified(num_accepted, _emit(drafts, num_accepted, last, k + 1))


def _race(probs: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    """A draw from each row of ``probs`` (unnormalized is fine) with exponential ``noise``:
    ``argmax(p / E)``, the same race the sampler runs."""
    return (probs / noise).argmax(dim=-1)


def accept_rejection(
    target_probs: torch.Tensor,
    drafts: torch.Tensor,
    num_drafts: torch.Tensor,
    uniforms: torch.Tensor,
    noise: torch.Tensor,
    draft_probs: torch.Tensor | None = None,
) -> Verified:
    """Rejection-sampling verification.

    ``target_probs``: ``[B, k + 1, V]``, the target's (already transformed and filtered)
    distributions; ``drafts``: ``[B, k]``; ``num_drafts``: ``[B]``; ``uniforms``: ``[B, k]``
    in [0, 1); ``noise``: ``[B, k + 1, V]``, Exp(1); ``draft_probs``: ``[B, k, V]``, the
    distributions the drafts were drawn from, or None for point-mass drafts."""
    batch, k = drafts.shape
    vocab = target_probs.shape[-1]
    if target_probs.shape != (batch, k + 1, vocab) or noise.shape != target_probs.shape:
        raise ValueError(
            f"target_probs {tuple(target_probs.shape)} and noise {tuple(noise.shape)} "
            f"for drafts {tuple(drafts.shape)}"
        )
    index = drafts.to(torch.int64).clamp(min=0)[:, :, None]
    p_draft = target_probs[:, :k].gather(2, index).squeeze(2)
    if draft_probs is None:
        q_draft = torch.ones_like(p_draft)
        q = torch.zeros_like(target_probs[:, :k]).scatter(2, index, 1.0)
    else:
        if draft_probs.shape != (batch, k, vocab):
            raise ValueError(
                f"draft_probs {tuple(draft_probs.shape)}, expected {(batch, k, vocab)}"
            )
        q = draft_probs
        q_draft = q.gather(2, index).squeeze(2)
    # Keep with probability min(1, p / q): u * q < p (q > 0 for a draft drawn from q).
    num_accepted = _first_reject(uniforms * q_draft < p_draft, num_drafts)
    # The draw at the stopping position: the residual after a rejection, p_k after none.
    rows = torch.arange(batch, device=drafts.device)
    p_stop = target_probs[rows, num_accepted]
    q_padded = torch.cat([q, torch.zeros_like(target_probs[:, :1])], dim=1)
    rejected = (num_accepted < num_drafts)[:, None]
    residual = torch.where(rejected, (p_stop - q_padded[rows, num_accepted]).clamp(min=0), p_stop)
    # p == q leaves no residual mass (a rejection then has probability 0): draw from p.
    empty = residual.sum(dim=-1, keepdim=True) <= 0
    residual = torch.where(empty, p_stop, residual)
    last = _race(residual, noise[rows, num_accepted])
    return Verified(num_accepted, _emit(drafts, num_accepted, last, k + 1))


def spec_noise(
    seed: int, first_index: int, k: int, vocab: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """A seeded request's randomness for one verification whose first emitted token is its
    output token ``first_index``: ``k`` uniforms and ``k + 1`` rows of Exp(1) noise, position
    ``j`` drawn from the generator of output index ``first_index + j``. A token's draw thus
    depends only on the seed and its index, however many drafts earlier rounds kept."""
    uniforms = torch.empty(k, device=device)
    noise = torch.empty(k + 1, vocab, device=device)
    for j in range(k + 1):
        gen = seeded_generator(seed, first_index + j, device)
        noise[j].exponential_(generator=gen)
        if j < k:
            uniforms[j : j + 1].uniform_(generator=gen)
    return uniforms, noise
