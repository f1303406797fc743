"""``speculative_config.method = "draft_model"``: a small causal LM on the rank drafts greedily.

The draft shares the target's tokenizer and runs beside it on the same rank. Once a round the
rank calls ``propose`` for its decoding requests; each request's history (prompt and every
output token, the last one just sampled) continues with ``k`` argmax tokens that the round's
verification then keeps or rejects (``spec_rounds``). Drafts never change what is emitted,
only how many tokens a verification yields.

Each request keeps its own K/V in the draft's dense cache (``draft_cache.DraftCache``, outside
the paged pool). A call reuses the longest prefix its row holds of the new history: the
drafts a verification kept are already there, and a rejected draft only truncates the row,
so a call costs the new tokens plus ``k - 1`` single-token steps. All requests of a call run
as one padded batch: one forward per step whatever the batch.

The forward is the project's decoder (``decoder.build_model``: the same loader, the same
``Attention``/``DenseMLP``/``RMSNorm`` modules and RoPE table) with attention over the dense
rows instead of the paged backend, so its logits equal ``CausalLM``'s on the same tokens.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import cast

import torch

from roundgate.actors.model.config import ModelConfig
from roundgate.actors.model.decoder import CausalLM, build_model, open_source
from roundgate.actors.model.draft_cache import DraftCache
from roundgate.actors.model.draft_checks import FIELD, check_draft, check_tokens
from roundgate.actors.model.gguf_blocks import pack_gguf
from roundgate.actors.model.layers import Attention, DenseMLP
from roundgate.actors.model.resolve import resolve_model_config
from roundgate.actors.model.rope import apply_rope

_SCRATCH = "\0draft-logits"  # the row ``logits`` borrows (no request id starts with NUL)


class DraftModel:
    """A small causal LM of the target's tokenizer on the same rank, drafting greedily.

    Dense GQA only: a MoE draft's experts are sharded over the DP group, so each of its
    forwards would be a round of the group's all-to-all collectives that every rank must
    join, the same number of times, whatever its own requests drafted; and an MLA draft
    would need the latent attention over a cache of its own. A dense draft's forward stays
    on its rank.
    """

    def __init__(
        self,
        model: CausalLM,
        *,
        max_requests: int,
        max_len: int,
        max_prefill_tokens: int | None = None,
    ) -> None:
        if max_prefill_tokens is not None and max_prefill_tokens < 1:
            raise ValueError(
                f"draft model: max_prefill_tokens must be >= 1, got {max_prefill_tokens}"
            )
        self.model = model
        self.max_prefill_tokens = max_prefill_tokens
        self.config = config = model.config
        if not all(
            isinstance(layer.self_attn, Attention) and isinstance(layer.mlp, DenseMLP)
            for layer in model.layers
        ):
            raise ValueError(f"{FIELD}: a draft must be a dense GQA model")
        param = model.embed_tokens.weight
        self.cache = DraftCache(
            config.num_layers,
            config.num_kv_heads,
            config.head_dim,
            max_requests=max_requests,
            max_len=min(max_len, config.max_position),
            dtype=param.dtype,
            device=param.device,
        )

    @classmethod
    def load(
        cls,
        model: str,
        target: ModelConfig,
        *,
        dtype: torch.dtype,
        device: torch.device | str,
        seed: int = 0,
        target_model: str | None = None,
        gguf_weights: str = "float",
        max_requests: int = 256,
        max_len: int | None = None,
        max_prefill_tokens: int | None = None,
    ) -> DraftModel:
        """The draft ``model``, resolved as ``--model`` is (a preset, a GGUF file, directory
        or packaged name, a HF safetensors directory), checked against the ``target``.

        Refused with a ``ValueError`` naming ``speculative_config.model``: an unreadable
        model; a vocabulary of another size, or (given ``target_model``) one whose tokens
        differ where both list them; a MoE or MLA draft; more parameters than the target.
        ``seed`` seeds a preset's weights (the target's ``--seed``: a preset is then its
        own exact draft). ``gguf_weights`` as ``--gguf-weights`` (CPU only). ``max_requests``
        and ``max_len`` (default: the draft's context) bound the draft's cache;
        ``max_prefill_tokens`` bounds the history tokens one ``propose`` runs (default: all).
        """
        try:
            config = resolve_model_config(model)
        except (ValueError, OSError) as exc:
            raise ValueError(f"{FIELD} {model!r}: cannot be read ({exc})") from None
        check_draft(model, config, target)
        if target_model is not None:
            check_tokens(model, target_model)
        try:
            source = open_source(model, config, seed)
            built = build_model(config, source, dtype=dtype, device=device)
        except (ValueError, OSError) as exc:
            raise ValueError(f"{FIELD} {model!r}: cannot be loaded ({exc})") from None
        if gguf_weights != "float" and torch.device(device).type == "cpu":
            pack_gguf(built, source, config.tie_word_embeddings, gguf_weights == "int8-dot")
        return cls(
            built,
            max_requests=max_requests,
            max_len=max_len or config.max_position,
            max_prefill_tokens=max_prefill_tokens,
        )

    @torch.inference_mode()
    def propose(
        self, histories: Mapping[str, Sequence[int]], k: Mapping[str, int]
    ) -> dict[str, tuple[int, ...]]:
        """Up to ``k[id]`` greedy drafts continuing each request's ``histories[id]``.

        A request with ``k`` 0 is skipped (its row kept); one whose drafts would run past
        the draft's ``max_len`` gets fewer (none when its history already does). Under
        ``max_prefill_tokens`` the requests with the fewest new tokens run first; one that
        does not fit runs what is left of the budget and drafts nothing this call (a new
        request's prompt is then caught up over a few rounds instead of stalling one).
        """
        missing = sorted(set(histories) - set(k))
        if missing:
            raise ValueError(f"draft model: no k given for request {missing[0]!r}")
        negative = sorted(r for r in histories if k[r] < 0)
        if negative:
            raise ValueError(f"draft model: k of request {negative[0]!r} is {k[negative[0]]} < 0")
        limit = self.cache.max_len
        # A draft i is read at position len + i - 1, which must be a position the draft has.
        wanted = {r: min(k[r], limit - len(h) + 1) for r, h in histories.items() if k[r] > 0 and h}
        ids = [r for r, n in wanted.items() if n > 0]
        out: dict[str, tuple[int, ...]] = {r: () for r in histories}
        if not ids:
            return out
        # The batch runs in row order: row i of the cache is request i of the batch.
        ids = [r for _, r in sorted(zip(self.cache.place(ids), ids, strict=True))]
        starts, news = {}, {}
        for r in ids:
            history = list(histories[r])
            # At least the last token is run again: its logits give the first draft.
            starts[r] = min(_common_prefix(self.cache.tokens(r), history), len(history) - 1)
            news[r] = history[starts[r] :]
            self.cache.set_tokens(r, history[: starts[r]])  # until this call's K/V is written
        budget = self.max_prefill_tokens or sum(len(t) for t in news.values())
        for r in sorted(ids, key=lambda r: len(news[r])):
            if len(news[r]) > budget:  # caught up in part: no drafts before the rest
                news[r], wanted[r] = news[r][:budget], 0
            budget -= len(news[r])
        drafts: list[list[int]] = [[] for _ in ids]
        counts = [wanted[r] for r in ids]
        step_tokens, starts_of = [news[r] for r in ids], [starts[r] for r in ids]
        for step in range(max(*counts, 1)):
            ends = [s + len(t) for s, t in zip(starts_of, step_tokens, strict=True)]
            self.cache.reserve(max(ends))
            logits = self._forward(step_tokens, starts_of)
            chosen = logits.argmax(dim=-1).tolist()
            for i, token in enumerate(chosen):
                if step < counts[i]:
                    drafts[i].append(token)
            # Next step: each request still drafting runs its newest draft (the others idle).
            starts_of = ends
            step_tokens = [
                [d[-1]] if step + 1 < c else [] for d, c in zip(drafts, counts, strict=True)
            ]
        for i, r in enumerate(ids):
            # The row holds what ran: the history (or its part that fit) and every draft but
            # the last (never run), the next call's prefix.
            ran = [*histories[r][: starts[r]], *news[r], *drafts[i][:-1]]
            self.cache.set_tokens(r, ran)
            out[r] = tuple(drafts[i])
        return out

    def release(self, request_id: str) -> None:
        """Drop a finished (or retracted) request's cached K/V."""
        self.cache.release(request_id)

    @torch.inference_mode()
    def logits(self, tokens: Sequence[int]) -> torch.Tensor:
        """Float32 logits ``[len(tokens), vocab]`` at every position of one sequence, from
        scratch (a check against other implementations; no request's K/V is kept)."""
        self.cache.place([_SCRATCH])
        try:
            self.cache.reserve(len(tokens))
            return self._forward([tokens], [0], every=True)
        finally:
            self.cache.release(_SCRATCH)

    def _forward(
        self, tokens: Sequence[Sequence[int]], starts: Sequence[int], every: bool = False
    ) -> torch.Tensor:
        """Float32 logits ``[B, vocab]`` after each row's last token of ``tokens`` (``every``:
        at each token, ``[N, vocab]``), row ``i`` of the cache holding its tokens from position
        ``starts[i]``; the K/V of every token is written there.

        The projections run on the real tokens only; attention runs padded, ``[B, T]`` queries
        over each row's ``0..start + T`` positions under a causal mask. A row with no tokens
        idles (its logits are meaningless; nothing is written)."""
        model = self.model
        device = model.embed_tokens.weight.device
        lengths = torch.tensor([len(t) for t in tokens])
        count, width = len(tokens), max(int(lengths.max()), 1)
        rows = torch.repeat_interleave(torch.arange(count), lengths)
        offsets = torch.cat([torch.arange(int(n)) for n in lengths])
        positions = torch.tensor(starts)[rows] + offsets
        span = int(max(s + int(n) for s, n in zip(starts, lengths, strict=True)))
        rows, offsets, positions = rows.to(device), offsets.to(device), positions.to(device)
        ids = torch.tensor([t for row in tokens for t in row], dtype=torch.long, device=device)
        # Query t of row i sits at starts[i] + t and sees the positions up to its own.
        seen = torch.tensor(starts, device=device)[:, None] + torch.arange(width, device=device)
        mask = (torch.arange(span, device=device) <= seen[:, :, None])[:, None, None]
        x = model.embed_tokens(ids)
        cos, sin = model.rotary.lookup(positions, x.dtype)
        for i, layer in enumerate(model.layers):
            h = layer.input_layernorm(x)
            attn = cast(Attention, layer.self_attn)  # checked in __init__, as is the MLP
            x = x + self._attention(i, attn, h, cos, sin, (rows, offsets, positions), mask)
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        if not every:
            x = x.index_select(0, torch.cumsum(lengths, 0).clamp(min=1).to(device) - 1)
        return model.lm_head(model.norm(x)).float()

    def _attention(
        self,
        layer: int,
        attn: Attention,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        where: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
        mask: torch.Tensor,
    ) -> torch.Tensor:
        rows, offsets, positions = where
        heads, kv_heads, dim = attn.num_heads, attn.num_kv_heads, attn.head_dim
        qkv = attn.qkv_proj(x).view(x.shape[0], heads + 2 * kv_heads, dim)
        qk, v = qkv[:, : heads + kv_heads], qkv[:, heads + kv_heads :]
        if attn.q_norm is not None and attn.k_norm is not None:
            qk = torch.cat((attn.q_norm(qk[:, :heads]), attn.k_norm(qk[:, heads:])), dim=1)
        qk = apply_rope(qk, cos, sin)
        self.cache.write(layer, rows, positions, qk[:, heads:], v)
        count, width, span = mask.shape[0], mask.shape[3], mask.shape[4]
        group = heads // kv_heads
        # Queries padded to [B, T], then grouped by the KV head they share: [B, kv, g * T, D]
        # (one product per KV head, no copy of the cached keys per query head).
        q = qk.new_zeros(count, width, heads, dim)
        q[rows, offsets] = qk[:, :heads]
        q = q.view(count, width, kv_heads, group, dim).permute(0, 2, 3, 1, 4)
        keys, values = self.cache.view(layer, count, span)
        scores = q.reshape(count, kv_heads, group * width, dim) @ keys.transpose(-1, -2)
        scores = scores.view(count, kv_heads, group, width, span) * attn.scale
        # Softmax in float32 (as the paged backends do) whatever the cache's dtype.
        weights = scores.float().masked_fill(~mask, float("-inf")).softmax(dim=-1)
        weights = weights.to(values.dtype)
        out = weights.view(count, kv_heads, group * width, span) @ values
        out = out.view(count, kv_heads, group, width, dim).permute(0, 3, 1, 2, 4)
        return attn.o_proj(out[rows, offsets].reshape(x.shape[0], heads * dim))


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n
