"""Batched token sampling: greedy, temperature, top-k, top-p, per-request seeds.

Sampling uses the exponential race (``argmax(p / q)`` with ``q ~ Exp(1)``), which draws
from ``p`` exactly and lets every row bring its own noise: a seeded request draws its
noise from a generator seeded by ``(seed, output index)``, so its tokens depend only on
its own seed and logits, never on which other requests share the batch.
Stop tokens and ``max_tokens`` are applied by ``Request.append_token``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from actors.control.request import SamplingParams

_SEED_MIX = 0x9E3779B97F4A7C15  # spreads (seed, index) pairs over the generator's seed space


def seeded_generator(seed: int, output_index: int, device: torch.device) -> torch.Generator:
    """The generator for token ``output_index`` of a request seeded with ``seed``."""
    mixed = (seed * _SEED_MIX + output_index) % (1 << 63)
    return torch.Generator(device=device).manual_seed(mixed)


def filter_sorted(
    sorted_logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor
) -> torch.Tensor:
    """Mask (to -inf) what top-k and top-p cut from logits sorted in descending order.

    ``top_k == 0`` keeps everything; top-p keeps the smallest prefix whose probability
    reaches ``top_p`` (always at least the most likely token).
    """
    vocab = sorted_logits.shape[-1]
    rank = torch.arange(vocab, device=sorted_logits.device)[None, :]
    k = torch.where(top_k > 0, top_k, vocab)[:, None]
    logits = sorted_logits.masked_fill(rank >= k, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    mass_before = torch.cumsum(probs, dim=-1) - probs
    # top_p == 1 cuts nothing (float rounding must not clip the tail).
    cut = (mass_before >= top_p[:, None]) & (top_p < 1)[:, None]
    return logits.masked_fill(cut, float("-inf"))


def sample_tokens(
    logits: torch.Tensor,
    params: Sequence[SamplingParams],
    output_indices: Sequence[int],
    generator: torch.Generator | None = None,
) -> list[int]:
    """One token per row of ``logits`` (``[B, vocab]``), row ``i`` under ``params[i]``.

    ``output_indices[i]`` is the index the token will have among the request's outputs
    (what seeded sampling keys on). Unseeded rows draw from ``generator``.
    """
    if len(params) != logits.shape[0] or len(output_indices) != logits.shape[0]:
        raise ValueError(
            f"sample_tokens: {logits.shape[0]} logit rows, {len(params)} params, "
            f"{len(output_indices)} output indices"
        )
    tokens = logits.argmax(dim=-1)
    rows = [i for i, p in enumerate(params) if p.temperature > 0]
    if not rows:
        return tokens.tolist()
    device = logits.device
    chosen = [params[i] for i in rows]
    temperature = torch.tensor([p.temperature for p in chosen], device=device)
    top_k = torch.tensor([p.top_k for p in chosen], device=device)
    top_p = torch.tensor([p.top_p for p in chosen], device=device)
    scaled = logits[rows].float() / temperature[:, None]
    sorted_logits, sorted_ids = torch.sort(scaled, dim=-1, descending=True, stable=True)
    probs = torch.softmax(filter_sorted(sorted_logits, top_k, top_p), dim=-1)
    noise = torch.empty_like(probs)
    unseeded = [j for j, p in enumerate(chosen) if p.seed is None]
    if unseeded:
        shared = torch.empty(len(unseeded), probs.shape[1], device=device)
        noise[unseeded] = shared.exponential_(generator=generator)
    for j, p in enumerate(chosen):
        if p.seed is not None:
            gen = seeded_generator(p.seed, output_indices[rows[j]], device)
            noise[j].exponential_(generator=gen)
    picked = (probs / noise).argmax(dim=-1, keepdim=True)
    tokens[rows] = sorted_ids.gather(1, picked).squeeze(1)
    return tokens.tolist()
