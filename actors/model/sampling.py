"""Batched token sampling: greedy, temperature, top-k, top-p, min-p, per-request seeds.

Per-request transforms (logit bias, min tokens, penalties) come first, from
``roundgate.actors.model.logit_transforms``; logprobs are read from the raw model distribution
before any of them (vLLM's default), so they describe the model, not the sampling settings.

Sampling uses the exponential race (``argmax(p / q)`` with ``q ~ Exp(1)``, computed as
``argmax(logits - log q)``), which draws from ``p`` exactly and lets every row bring its own
noise: a seeded request draws its noise from a generator seeded by ``(seed, output index)``,
so its tokens depend only on its own seed and logits, never on which other requests share
the batch.
Stop tokens and ``max_tokens`` are applied by ``Request.append_token``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from roundgate.actors.control.request import SamplingParams, TokenLogprobs
from roundgate.actors.model.logit_transforms import History, apply_transforms

_SEED_MIX = 0x9E3779B97F4A7C15  # spreads (seed, index) pairs over the generator's seed space


def seeded_generator(seed: int, output_index: int, device: torch.device) -> torch.Generator:
    """The generator for token ``output_index`` of a request seeded with ``seed``."""
    mixed = (seed * _SEED_MIX + output_index) % (1 << 63)
    return torch.Generator(device=device).manual_seed(mixed)


def filter_sorted(
    sorted_logits: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    min_p: torch.Tensor | None = None,
) -> torch.Tensor:
    """Mask (to -inf) what top-k, top-p and min-p cut from logits sorted in descending order.

    ``top_k == 0`` keeps everything; top-p keeps the smallest prefix whose probability
    reaches ``top_p`` (always at least the most likely token); min-p then drops tokens less
    likely than ``min_p`` times the most likely one (transformers' ``MinPLogitsWarper``).
    """
    vocab = sorted_logits.shape[-1]
    rank = torch.arange(vocab, device=sorted_logits.device)[None, :]
    k = torch.where(top_k > 0, top_k, vocab)[:, None]
    logits = sorted_logits.masked_fill(rank >= k, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    mass_before = torch.cumsum(probs, dim=-1) - probs
    # top_p == 1 cuts nothing (float rounding must not clip the tail).
    cut = (mass_before >= top_p[:, None]) & (top_p < 1)[:, None]
    logits = logits.masked_fill(cut, float("-inf"))
    if min_p is not None and bool((min_p > 0).any()):
        probs = torch.softmax(logits, dim=-1)
        logits = logits.masked_fill(probs < min_p[:, None] * probs[:, :1], float("-inf"))
    return logits


def sample_tokens(
    logits: torch.Tensor,
    params: Sequence[SamplingParams],
    output_indices: Sequence[int],
    generator: torch.Generator | None = None,
    histories: Sequence[History] | None = None,
) -> list[int]:
    """One token per row of ``logits`` (``[B, vocab]``), row ``i`` under ``params[i]``."""
    return sample(logits, params, output_indices, generator, histories)[0]


def sample(
    logits: torch.Tensor,
    params: Sequence[SamplingParams],
    output_indices: Sequence[int],
    generator: torch.Generator | None = None,
    histories: Sequence[History] | None = None,
    allowed: torch.Tensor | None = None,
) -> tuple[list[int], list[TokenLogprobs | None]]:
    """Tokens, and each row's logprobs when its params ask for them (else None).

    ``output_indices[i]`` is the index the token will have among the request's outputs
    (what seeded sampling and ``min_tokens`` key on); ``histories[i]`` its prompt and output
    ids (read for penalties only); ``allowed`` an optional ``[B, vocab]`` boolean mask (a
    grammar's). Unseeded rows draw from ``generator``.
    """
    if len(params) != logits.shape[0] or len(output_indices) != logits.shape[0]:
        raise ValueError(
            f"sample_tokens: {logits.shape[0]} logit rows, {len(params)} params, "
            f"{len(output_indices)} output indices"
        )
    logprob_rows = [i for i, p in enumerate(params) if p.logprobs is not None]
    raw = logits
    if any(p.needs_transforms for p in params):
        logits = apply_transforms(logits.float(), params, output_indices, histories)
    if allowed is not None:
        logits = logits.masked_fill(~allowed, float("-inf"))
    tokens = _pick(logits, params, output_indices, generator)
    logprobs: list[TokenLogprobs | None] = [None] * len(params)
    if logprob_rows:
        for i, entry in zip(
            logprob_rows, _logprobs(raw, params, logprob_rows, tokens), strict=True
        ):
            logprobs[i] = entry
    return tokens.tolist(), logprobs


def _logprobs(
    raw: torch.Tensor, params: Sequence[SamplingParams], rows: list[int], tokens: torch.Tensor
) -> list[TokenLogprobs]:
    """The sampled token's log-probability and the top ``k`` per row, in one top-k call."""
    index = torch.tensor(rows, device=raw.device)
    logp = torch.log_softmax(raw[index].float(), dim=-1)
    chosen = logp.gather(1, tokens[index][:, None]).squeeze(1).tolist()
    k = max(params[i].logprobs or 0 for i in rows)
    top_lp, top_ids = logp.topk(k, dim=-1) if k else (logp[:, :0], logp[:, :0].long())
    top_lp, top_ids = top_lp.tolist(), top_ids.tolist()
    out = []
    for j, i in enumerate(rows):
        n = params[i].logprobs or 0
        out.append(TokenLogprobs(chosen[j], tuple(top_ids[j][:n]), tuple(top_lp[j][:n])))
    return out


def _pick(
    logits: torch.Tensor,
    params: Sequence[SamplingParams],
    output_indices: Sequence[int],
    generator: torch.Generator | None,
) -> torch.Tensor:
    """Greedy rows take the argmax; the others race exponential noise (see the module doc).

    Rows with a cut (top-k, top-p, min-p) race over the sorted distribution; rows without
    one race in vocabulary order and skip the sort (most of a sampled round's cost). Which
    path a row takes depends on its own params only, so a seed's tokens never depend on the
    batch.
    """
    tokens = logits.argmax(dim=-1)
    sampled = [i for i, p in enumerate(params) if p.temperature > 0]
    if not sampled:
        return tokens
    cut = [i for i in sampled if params[i].top_k or params[i].top_p < 1 or params[i].min_p > 0]
    plain = [i for i in sampled if i not in set(cut)]
    for rows, sort in ((cut, True), (plain, False)):
        if rows:
            tokens[rows] = _race(logits, params, output_indices, generator, rows, sort)
    return tokens


def _race(
    logits: torch.Tensor,
    params: Sequence[SamplingParams],
    output_indices: Sequence[int],
    generator: torch.Generator | None,
    rows: list[int],
    sort: bool,
) -> torch.Tensor:
    device = logits.device
    chosen = [params[i] for i in rows]
    temperature = torch.tensor([p.temperature for p in chosen], device=device)
    scaled = logits[rows].float() / temperature[:, None]
    sorted_ids = None
    if sort:
        top_k = torch.tensor([p.top_k for p in chosen], device=device)
        top_p = torch.tensor([p.top_p for p in chosen], device=device)
        min_p = torch.tensor([p.min_p for p in chosen], device=device)
        scaled, sorted_ids = torch.sort(scaled, dim=-1, descending=True, stable=True)
        scaled = filter_sorted(scaled, top_k, top_p, min_p)
    # The race ``argmax(p / q)``, q ~ Exp(1), as ``argmax(logits - log q)`` with
    # ``q = -log(u)``, u ~ U(0, 1): no softmax, and uniform draws are several times cheaper
    # than torch's exponential sampler (bench_sampler).
    uniform = torch.empty_like(scaled)
    unseeded = [j for j, p in enumerate(chosen) if p.seed is None]
    if unseeded:
        shared = torch.rand(len(unseeded), scaled.shape[1], generator=generator, device=device)
        uniform[unseeded] = shared
    for j, p in enumerate(chosen):
        if p.seed is not None:
            gen = seeded_generator(p.seed, output_indices[rows[j]], device)
            uniform[j] = torch.rand(scaled.shape[1], generator=gen, device=device)
    gumbel = uniform.log_().neg_().log_().neg_()  # -log q
    picked = (scaled + gumbel).argmax(dim=-1, keepdim=True)
    if sorted_ids is not None:
        picked = sorted_ids.gather(1, picked)
    return picked.squeeze(1)
