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

from roundgate.actors.control.request import SamplingParams

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
        _penalise(logits, params, histories, penalised)
    return logits


def _penalise(
    logits: torch.Tensor,
    params: Sequence[SamplingParams],
    histories: Sequence[History],
    rows: list[int],
) -> None:
    """Repetition penalty over prompt and output; presence and frequency over the output.

    In place and sparse: only the (row, token) pairs a history holds are touched (found with
    one ``unique`` over flat indices), so no ``[B, vocab]`` temporary is built.
    """
    vocab = logits.shape[1]
    device = logits.device
    flat = logits.view(-1)
    repeated = [i for i in rows if params[i].repetition_penalty != 1]
    if repeated:
        seen = _flat_ids([(i, [*histories[i][0], *histories[i][1]]) for i in repeated], vocab)
        index = torch.unique(torch.tensor(seen, dtype=torch.long, device=device))
        penalty = torch.tensor([params[i].repetition_penalty for i in range(len(params))])
        factor = penalty.to(device)[index // vocab]
        values = flat[index]
        flat[index] = torch.where(values < 0, values * factor, values / factor)
    counted = [i for i in rows if params[i].presence_penalty or params[i].frequency_penalty]
    if counted:
        outputs = _flat_ids([(i, histories[i][1]) for i in counted], vocab)
        if outputs:
            index, counts = torch.unique(
                torch.tensor(outputs, dtype=torch.long, device=device), return_counts=True
            )
            row = index // vocab
            frequency = torch.tensor([p.frequency_penalty for p in params], device=device)
            presence = torch.tensor([p.presence_penalty for p in params], device=device)
            flat.index_add_(0, index, -(frequency[row] * counts + presence[row]))


def _flat_ids(rows: list[tuple[int, Sequence[int]]], vocab: int) -> list[int]:
    """``row * vocab + token`` for every token of every row (the logits' flat index)."""
    out: list[int] = []
    for row, tokens in rows:
        base = row * vocab
        out += [base + t for t in tokens]
    return out


def _long(values: list[int], device: torch.device) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.long, device=device)
