"""The MoE router's choice in one Triton launch: scores, grouped limits, top-k, weights.

``route`` is ``Router.forward`` (``actors/model/moe.py``) after its ``F.linear``: the ~20
torch ops it runs per layer (softmax or sigmoid, group scores, group top-k, masks, expert
top-k, gather, renormalisation) become one program per token, so a captured decode graph
holds one node for them and nothing is read back to the host.

Every router the config reader accepts is covered:

* softmax + ``greedy`` (Mixtral, Qwen): the top-k probabilities, renormalised when
  ``norm_topk_prob`` (plain division, as transformers does);
* softmax + ``group_limited_greedy`` (DeepSeek-V2): groups ranked by their best expert,
  the rest masked with 0.0;
* sigmoid + ``e_score_correction_bias`` + ``noaux_tc`` (DeepSeek-V3): groups ranked by the
  sum of their two best *biased* scores, the rest masked with -inf; experts chosen on the
  biased scores, weighed by the unbiased ones; the sum guarded with 1e-20.

Layout: one token's scores as a ``[BLOCK_G, BLOCK_S]`` tile, expert ``g * S + s`` at row
``g`` (its group), column ``s``; ungrouped routers use one row. Each top-k (groups, then
experts) takes the maximum and masks it, ``k`` times: the lowest index wins a tie, which
is what ``torch.topk`` returns on these inputs. Ids come out in descending choice score.
"""

from __future__ import annotations

from typing import Protocol

import torch
import triton
import triton.language as tl

SCORINGS = ("softmax", "sigmoid")
TOPK_METHODS = ("greedy", "group_limited_greedy", "noaux_tc")
# How a group is scored before the group top-k (the kernel's GROUP_SCORE constexpr).
_NO_GROUPS, _GROUP_MAX, _GROUP_TOP2_SUM = 0, 1, 2


class RouterSettings(Protocol):
    """What ``supports`` reads of a router config (``RouterConfig`` in ``actors/model``,
    which this layer may not import)."""

    scoring: str
    topk_method: str


def supports(router_config: RouterSettings) -> bool:
    """Whether ``route`` computes this router: every scoring and top-k method the config
    reader accepts (kept as a predicate so a caller can fall back if one is added)."""
    return router_config.scoring in SCORINGS and router_config.topk_method in TOPK_METHODS


@triton.jit
def _route_kernel(
    logits_ptr,
    bias_ptr,
    weights_ptr,
    ids_ptr,
    num_experts,
    group_size,
    stride_logits,
    tiny,
    scale,
    SIGMOID: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    GROUP_SCORE: tl.constexpr,
    NUM_GROUPS: tl.constexpr,
    TOPK_GROUP: tl.constexpr,
    TOP_K: tl.constexpr,
    NORM: tl.constexpr,
    BLOCK_G: tl.constexpr,
    BLOCK_S: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    token = tl.program_id(0)
    g_idx = tl.arange(0, BLOCK_G)
    s_idx = tl.arange(0, BLOCK_S)
    experts = g_idx[:, None] * group_size + s_idx[None, :]  # [BLOCK_G, BLOCK_S]
    valid = (g_idx[:, None] < NUM_GROUPS) & (s_idx[None, :] < group_size)
    logits = tl.load(
        logits_ptr + token * stride_logits + experts, mask=valid, other=float("-inf")
    ).to(tl.float32)
    if SIGMOID:
        scores = tl.sigmoid(logits)
    else:
        shifted = tl.exp(logits - tl.max(logits))
        scores = shifted / tl.sum(shifted)
    scores = tl.where(valid, scores, 0.0)
    choice = scores
    if HAS_BIAS:
        choice += tl.load(bias_ptr + experts, mask=valid, other=0.0).to(tl.float32)
    choice = tl.where(valid, choice, float("-inf"))
    big = BLOCK_G * BLOCK_S  # past every index: loses every lowest-index tie-break

    if GROUP_SCORE != 0:
        best = tl.max(choice, axis=1)  # [BLOCK_G]
        if GROUP_SCORE == 2:
            # noaux_tc: the sum of the two best (the second may equal the first).
            first = tl.min(tl.where(choice == best[:, None], s_idx[None, :], big), axis=1)
            rest = tl.where(s_idx[None, :] == first[:, None], float("-inf"), choice)
            group_scores = best + tl.max(rest, axis=1)
        else:
            group_scores = best
        group_scores = tl.where(g_idx < NUM_GROUPS, group_scores, float("-inf"))
        keep = g_idx < 0
        for _ in tl.static_range(TOPK_GROUP):
            top = tl.max(group_scores)
            pick = tl.min(tl.where(group_scores == top, g_idx, big))
            keep |= g_idx == pick
            group_scores = tl.where(g_idx == pick, float("-inf"), group_scores)
        # V3 masks the other groups' experts with -inf, V2 with 0.0 (below any probability).
        if GROUP_SCORE == 2:
            choice = tl.where(valid & ~keep[:, None], float("-inf"), choice)
        else:
            choice = tl.where(valid & ~keep[:, None], 0.0, choice)

    k_idx = tl.arange(0, BLOCK_K)
    weights = tl.zeros([BLOCK_K], dtype=tl.float32)
    ids = tl.zeros([BLOCK_K], dtype=tl.int64)
    for j in tl.static_range(TOP_K):
        top = tl.max(choice)
        pick = tl.min(tl.where(choice == top, experts, big))
        chosen = experts == pick
        weights = tl.where(k_idx == j, tl.sum(tl.where(chosen, scores, 0.0)), weights)
        ids = tl.where(k_idx == j, pick.to(tl.int64), ids)
        choice = tl.where(chosen, float("-inf"), choice)
    if NORM:
        weights = weights / (tl.sum(weights) + tiny)
    weights = weights * scale
    k_ok = k_idx < TOP_K
    tl.store(weights_ptr + token * TOP_K + k_idx, weights, mask=k_ok)
    tl.store(ids_ptr + token * TOP_K + k_idx, ids, mask=k_ok)


def route(
    logits: torch.Tensor,
    bias: torch.Tensor | None,
    *,
    scoring: str,
    n_group: int,
    topk_group: int,
    topk_method: str,
    top_k: int,
    norm_topk_prob: bool,
    routed_scaling_factor: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(weights [T, top_k] float32, ids [T, top_k] int64)`` for router ``logits [T, E]``,
    as ``Router.forward`` computes them after its ``F.linear``; ``bias`` is V3's
    ``e_score_correction_bias`` (added to the choice only). Three ops: two outputs, one
    launch (two when ``T == 0``).

    Example: softmax/greedy, ``top_k=2``, logits ``[[0, 1, 2, 3]]`` -> ids ``[[3, 2]]``,
    weights ``[[0.644, 0.237]]`` (``[[0.731, 0.269]]`` with ``norm_topk_prob``).
    """
    if scoring not in SCORINGS:
        raise ValueError(f"scoring {scoring!r} is not supported by the Triton router {SCORINGS}")
    if topk_method not in TOPK_METHODS:
        raise ValueError(
            f"topk_method {topk_method!r} is not supported by the Triton router {TOPK_METHODS}"
        )
    num_tokens, num_experts = logits.shape
    grouped = topk_method != "greedy"
    num_groups = n_group if grouped else 1
    if num_experts % num_groups or not 1 <= topk_group <= num_groups:
        raise ValueError(
            f"n_group {n_group} / topk_group {topk_group} do not split {num_experts} experts"
        )
    group_size = num_experts // num_groups
    if topk_method == "noaux_tc" and group_size < 2:
        raise ValueError(f"topk_method noaux_tc needs 2+ experts a group, got {group_size}")
    if not 1 <= top_k <= num_experts:
        raise ValueError(f"top_k {top_k} must be in 1..{num_experts}")
    if logits.stride(-1) != 1:
        logits = logits.contiguous()
    weights = torch.empty(num_tokens, top_k, dtype=torch.float32, device=logits.device)
    ids = torch.empty(num_tokens, top_k, dtype=torch.int64, device=logits.device)
    if num_tokens == 0:
        return weights, ids
    method = {"greedy": _NO_GROUPS, "group_limited_greedy": _GROUP_MAX}
    _route_kernel[(num_tokens,)](
        logits,
        logits if bias is None else bias,  # never read without HAS_BIAS
        weights,
        ids,
        num_experts,
        group_size,
        logits.stride(0),
        # DeepSeek guards the sum with 1e-20; the plain softmax families divide plainly.
        1e-20 if scoring == "sigmoid" or grouped else 0.0,
        float(routed_scaling_factor),
        SIGMOID=scoring == "sigmoid",
        HAS_BIAS=bias is not None,
        GROUP_SCORE=method.get(topk_method, _GROUP_TOP2_SUM),
        NUM_GROUPS=num_groups,
        TOPK_GROUP=topk_group if grouped else 1,
        TOP_K=top_k,
        NORM=norm_topk_prob,
        BLOCK_G=triton.next_power_of_2(num_groups),
        BLOCK_S=triton.next_power_of_2(group_size),
        BLOCK_K=triton.next_power_of_2(top_k),
    )
    return weights, ids
