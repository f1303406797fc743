"""Per-request logit transforms, applied to the whole batch at once.

Each transform gathers the rows that use it and touches them with one indexed tensor
operation (``index_put_`` for biases and masks, ``scatter`` for token counts), so the cost
grows with the rows and tokens involved, never with a Python loop over the vocabulary.
The definitions follow transformers' logits processors (``SequenceBiasLogitsProcessor``,
``MinNewTokensLengthLogitsProcessor``, ``RepetitionPenaltyLogitsProcessor``) and OpenAI's
presence/frequency formula: ``logit -= frequency * count + presence * (count > 0)``, counted
over the output tokens.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from actors.control.request import SamplingParams

# (prompt token ids, output token ids) of one row; only read for rows with penalties.
History = tuple[Sequence[int], Sequence[int]]


def apply_transforms(
    logits: torch.Tensor,
    params: Sequence[SamplingParams],
    output_indices: Sequence[int],
    histories: Sequence[History] | None,
) -> torch.Tensor:
    """``logits`` (``[B, V]``, float) with every row's bias, min-tokens mask and penalties
    applied, in that order. Rows without transforms are returned unchanged."""
    vocab = logits.shape[1]
    device = logits.device
    bias_rows: list[int] = []
    bias_ids: list[int] = []
    bias_values: list[float] = []
    mask_rows: list[int] = []
    mask_ids: list[int] = []
    penalised: list[int] = []
    for i, p in enumerate(params):
        if not p.needs_transforms:
            continue
        for token, bias in p.logit_bias:
            bias_rows.append(i)
            bias_ids.append(token)
            bias_values.append(bias)
        if output_indices[i] < p.min_tokens:
            for token in p.stop_token_ids:
                if token < vocab:
                    mask_rows.append(i)
                    mask_ids.append(token)
        if p.needs_history:
            penalised.append(i)
    if not (bias_rows or mask_rows or penalised):
        return logits
    logits = logits.clone()
    if bias_rows:
        index = (_long(bias_rows, device), _long(bias_ids, device))
        logits.index_put_(index, torch.tensor(bias_values, device=device), accumulate=True)
    if mask_rows:
        index = (_long(mask_rows, device), _long(mask_ids, device))
        logits.index_put_(index, torch.tensor(float("-inf"), device=device))
    if penalised:
        if histories is None:
            raise ValueError("penalties need each row's token history")
        rows = _long(penalised, device)
        chosen = [params[i] for i in penalised]
        logits[rows] = _penalise(logits[rows], chosen, [histories[i] for i in penalised])
    return logits


def _penalise(
    logits: torch.Tensor, params: Sequence[SamplingParams], histories: Sequence[History]
) -> torch.Tensor:
    """Repetition penalty over prompt and output; presence and frequency over the output."""
    vocab = logits.shape[1]
    device = logits.device
    outputs = _padded([list(out) for _, out in histories], vocab, device)
    counts = torch.zeros(len(params), vocab + 1, device=device)
    counts.scatter_add_(1, outputs, torch.ones_like(outputs, dtype=counts.dtype))
    counts = counts[:, :vocab]
    repetition = torch.tensor([p.repetition_penalty for p in params], device=device)[:, None]
    if bool((repetition != 1).any()):
        prompts = _padded([list(prompt) for prompt, _ in histories], vocab, device)
        seen = torch.zeros(len(params), vocab + 1, dtype=torch.bool, device=device)
        seen.scatter_(1, prompts, True)
        seen = seen[:, :vocab] | (counts > 0)
        scaled = torch.where(logits < 0, logits * repetition, logits / repetition)
        logits = torch.where(seen, scaled, logits)
    frequency = torch.tensor([p.frequency_penalty for p in params], device=device)[:, None]
    presence = torch.tensor([p.presence_penalty for p in params], device=device)[:, None]
    return logits - frequency * counts - presence * (counts > 0).to(logits.dtype)


def _padded(rows: list[list[int]], pad: int, device: torch.device) -> torch.Tensor:
    """``rows`` as one ``[R, longest]`` long tensor, padded with ``pad`` (an extra column the
    caller drops), so a single scatter covers every row."""
    width = max(1, max(len(r) for r in rows))
    return torch.tensor([r + [pad] * (width - len(r)) for r in rows], device=device)


def _long(values: list[int], device: torch.device) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.long, device=device)
