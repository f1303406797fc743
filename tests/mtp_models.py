"""A tiny random DeepSeek-V3 directory with a next-n (MTP) layer, and its reference.

transformers' ``DeepseekV3ForCausalLM`` has no MTP layer, so the directory is the family
builder's model saved as usual, plus the layer's tensors under ``model.layers.{N}.`` in a
second safetensors file (as DeepSeek ships it: ``enorm``, ``hnorm``, ``eh_proj``,
``shared_head.norm``, then an ordinary MoE decoder block), and ``num_nextn_predict_layers: 1``
in its config.

The reference computes the next-n logits of a whole sequence without any cache, from
transformers' own modules: the main model's normed last hidden states, the projection written
out here, and the block run as the only layer of a one-layer transformers DeepSeek-V3 (its
final norm the layer's ``shared_head.norm``, its head the main model's).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from family_models import build_family
from safetensors.torch import save_file

NEXT_N_FILE = "model-next-n.safetensors"


def _block_model(main: torch.nn.Module) -> torch.nn.Module:
    """A one-layer DeepSeek-V3 of ``main``'s shape whose layer is sparse (the MTP block)."""
    from transformers import DeepseekV3ForCausalLM

    config = main.config.__class__.from_dict(
        {**main.config.to_dict(), "num_hidden_layers": 1, "first_k_dense_replace": 0}
    )
    return DeepseekV3ForCausalLM(config).eval()


def _silence(model: torch.nn.Module) -> None:
    """Zero every block's output projections: each block then adds nothing to its input."""
    for name, value in model.named_parameters():
        if name.endswith("o_proj.weight") or "down_proj" in name:
            value.zero_()


def save_deepseek_with_next_n(
    path: Path, seed: int = 0, per_token: bool = False
) -> dict[str, torch.nn.Module]:
    """Write the directory; returns ``main`` (the transformers model), ``block`` (the
    one-layer model holding the MTP block) and ``proj`` (enorm, hnorm, eh_proj).

    ``per_token``: a model whose next token depends on the current token only (every block
    silenced: ``f(t) = argmax(head(norm(embed(t))))``) and a next-n layer that applies ``f``
    to the next token's embedding: it drafts ``f(t[p+1]) = t[p+2]``, always right, so every
    draft is kept.
    """
    main = build_family("deepseek_v3", seed)
    if per_token:
        with torch.no_grad():
            _silence(main)
    main.save_pretrained(path)
    torch.manual_seed(seed + 1)
    block = _block_model(main)
    hidden = main.config.hidden_size
    with torch.no_grad():
        for layer in block.model.layers:
            layer.mlp.gate.e_score_correction_bias.normal_(0, 0.5)
        proj = torch.nn.ModuleDict(
            {
                "enorm": torch.nn.LayerNorm(hidden),  # only its weight is used (an RMSNorm's)
                "hnorm": torch.nn.LayerNorm(hidden),
                "eh_proj": torch.nn.Linear(2 * hidden, hidden, bias=False),
            }
        )
        proj["enorm"].weight.uniform_(0.5, 1.5)
        proj["hnorm"].weight.uniform_(0.5, 1.5)
        proj["eh_proj"].weight.normal_(0, 0.2)
        block.model.norm.weight.uniform_(0.5, 1.5)
        if per_token:
            _silence(block)
            for weight in (proj["enorm"].weight, proj["hnorm"].weight, block.model.norm.weight):
                weight.fill_(1.0)
            proj["eh_proj"].weight.zero_()
            proj["eh_proj"].weight[:, :hidden] = torch.eye(hidden)
        block.lm_head.weight.copy_(main.lm_head.weight)
        block.model.embed_tokens.weight.copy_(main.model.embed_tokens.weight)
    n = main.config.num_hidden_layers
    prefix = f"model.layers.{n}."
    tensors = {
        prefix + name[len("model.layers.0.") :]: value
        for name, value in block.state_dict().items()
        if name.startswith("model.layers.0.")
    }
    tensors[prefix + "enorm.weight"] = proj["enorm"].weight
    tensors[prefix + "hnorm.weight"] = proj["hnorm"].weight
    tensors[prefix + "eh_proj.weight"] = proj["eh_proj"].weight
    tensors[prefix + "shared_head.norm.weight"] = block.model.norm.weight
    # Copies DeepSeek stores with the layer; the engine uses the main model's.
    tensors[prefix + "shared_head.head.weight"] = main.lm_head.weight
    tensors[prefix + "embed_tokens.weight"] = main.model.embed_tokens.weight
    save_file({k: v.detach().contiguous().clone() for k, v in tensors.items()}, path / NEXT_N_FILE)
    config_path = path / "config.json"
    config = json.loads(config_path.read_text())
    config["num_nextn_predict_layers"] = 1
    config_path.write_text(json.dumps(config))
    index = path / "model.safetensors.index.json"
    if index.is_file():  # a sharded save: the index must name the new file's tensors too
        body = json.loads(index.read_text())
        body["weight_map"].update(dict.fromkeys(tensors, NEXT_N_FILE))
        index.write_text(json.dumps(body))
    return {"main": main, "block": block, "proj": proj}


def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


@torch.no_grad()
def reference_next_n_logits(parts: dict[str, torch.nn.Module], ids: list[int]) -> torch.Tensor:
    """``[len(ids) - 1, vocab]``: row ``p`` is the next-n layer's logits at position ``p``
    (its guess at token ``p + 2``), from ``h_p`` and the embedding of ``ids[p + 1]``."""
    main, block, proj = parts["main"], parts["block"], parts["proj"]
    eps = main.config.rms_norm_eps
    tokens = torch.tensor([ids])
    hidden = main.model(input_ids=tokens).last_hidden_state[0, :-1]  # normed, as served
    embeds = main.model.embed_tokens(tokens[0, 1:])
    x = torch.cat(
        [_rms(embeds, proj["enorm"].weight, eps), _rms(hidden, proj["hnorm"].weight, eps)], -1
    )
    x = proj["eh_proj"](x)
    return block(inputs_embeds=x[None]).logits[0]
