"""Whether a model can draft for another (``speculative_config.model``): checked from the
configs and the token lists alone, without torch, so ``ServerArgs`` refuses a bad draft in
the control plane before any rank loads it, and ``DraftModel.load`` checks again.

What must hold: the same vocabulary (its size, and the same token at every id both models
list), a dense GQA draft (``draft_model.DraftModel`` says why), and no more parameters than
the target.
"""

from __future__ import annotations

from pathlib import Path

from roundgate.actors.model import gguf_file
from roundgate.actors.model.config import PRESETS, ModelConfig, read_json_object
from roundgate.actors.model.config_parts import MLAConfig

FIELD = "speculative_config.model"


def check_draft(model: str, draft: ModelConfig, target: ModelConfig) -> None:
    """Refuse a draft that cannot draft for ``target`` (errors name the field)."""
    if draft.vocab_size != target.vocab_size:
        raise ValueError(
            f"{FIELD} {model!r}: its vocabulary has {draft.vocab_size} tokens, the target's "
            f"{target.vocab_size}: a draft must share the target's tokenizer"
        )
    if draft.is_moe or draft.mla is not None:
        kind = "MoE" if draft.is_moe else "latent-attention (MLA)"
        raise ValueError(
            f"{FIELD} {model!r}: a {kind} draft is not supported: a draft must be a dense "
            "GQA model (a MoE draft's every forward would need the DP group's collectives)"
        )
    drafted, targeted = parameter_count(draft), parameter_count(target)
    if drafted > targeted:
        raise ValueError(
            f"{FIELD} {model!r}: the draft has {drafted:,} parameters, more than the "
            f"target's {targeted:,}: a draft must be the smaller model"
        )


def check_tokens(model: str, target_model: str) -> None:
    """Refuse a draft whose token list differs from the target's at an id both list (GGUF
    metadata, a directory's ``tokenizer.json``); nothing is compared where either has none
    (a preset's byte tokenizer, a directory without one)."""
    mine, theirs = token_list(model), token_list(target_model)
    if mine is None or theirs is None:
        return
    for token_id in sorted(mine.keys() & theirs.keys()):
        if mine[token_id] != theirs[token_id]:
            raise ValueError(
                f"{FIELD} {model!r}: token {token_id} is {mine[token_id]!r}, the target's "
                f"{theirs[token_id]!r}: a draft must share the target's tokenizer"
            )


def token_list(model: str) -> dict[int, str] | None:
    """Token id -> token text as the model's files list them, or None where they list none."""
    if model in PRESETS:
        return None
    path = gguf_file.find_gguf(model)
    if path is not None:
        tokens = gguf_file.read_header(path).get("tokenizer.ggml.tokens")
        return dict(enumerate(tokens)) if tokens else None
    file = Path(model) / "tokenizer.json"
    if not file.is_file():
        return None
    body = read_json_object(file)
    vocab = dict(body.get("model", {}).get("vocab", {}) or {})
    vocab.update({t["content"]: t["id"] for t in body.get("added_tokens", [])})
    return {int(i): text for text, i in vocab.items()} or None


def parameter_count(config: ModelConfig) -> int:
    """Weights the config describes (every expert of a MoE; norms and biases left out)."""
    hidden, vocab = config.hidden_size, config.vocab_size
    total = vocab * hidden * (1 if config.tie_word_embeddings else 2)
    for layer in range(config.num_layers):
        total += _attention_weights(config, config.mla)
        if config.is_moe_layer(layer):
            experts = config.num_experts * config.moe_intermediate_size
            shared = config.shared_expert_intermediate_size
            total += 3 * hidden * (experts + shared) + hidden * config.num_experts
        else:
            total += 3 * hidden * config.intermediate_size
    return total


def _attention_weights(config: ModelConfig, mla: MLAConfig | None) -> int:
    hidden, heads = config.hidden_size, config.num_heads
    if mla is None:
        return hidden * (2 * config.q_size + 2 * config.kv_size)
    q_out = heads * mla.qk_head_dim
    query = hidden * q_out if mla.q_lora_rank is None else mla.q_lora_rank * (hidden + q_out)
    latent = hidden * mla.latent_width
    expand = mla.kv_lora_rank * heads * (mla.qk_nope_head_dim + mla.v_head_dim)
    return query + latent + expand + heads * mla.v_head_dim * hidden
