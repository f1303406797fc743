"""Draft verification: the accept/resample tables, greedy equality with the target's argmax,
the rejection sampler's output distribution against the target's (fixed seed, stated
tolerance), and seeded reproducibility."""

from __future__ import annotations

import pytest
import torch

from roundgate.actors.model.spec_verify import (
    accept_greedy,
    accept_rejection,
    spec_noise,
)


def rows(*values: list[int]) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int64)


# ---- greedy -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("target", "drafts", "num_drafts", "accepted", "emitted"),
    [
        ([7, 8, 9, 4], [7, 8, 9], 3, 3, [7, 8, 9, 4]),  # all kept, plus the bonus token
        ([7, 8, 9, 4], [7, 5, 9], 3, 1, [7, 8, -1, -1]),  # stops at the first disagreement
        ([7, 8, 9, 4], [1, 8, 9], 3, 0, [7, -1, -1, -1]),  # none kept: the target's token
        ([7, 8, 9, 4], [7, 8, 9], 1, 1, [7, 8, -1, -1]),  # only one draft is real
        ([7, 8, 9, 4], [0, 0, 0], 0, 0, [7, -1, -1, -1]),  # no drafts: a plain decode step
    ],
)
def test_greedy_table(target, drafts, num_drafts, accepted, emitted) -> None:
    out = accept_greedy(rows(target), rows(drafts), torch.tensor([num_drafts]))
    assert out.num_accepted.tolist() == [accepted]
    assert out.tokens.tolist() == [emitted]


def test_greedy_emits_exactly_the_targets_argmaxes_up_to_the_first_disagreement() -> None:
    gen = torch.Generator().manual_seed(0)
    target = torch.randint(0, 4, (500, 5), generator=gen)
    drafts = torch.where(
        torch.rand(500, 4, generator=gen) < 0.7,
        target[:, :4],
        torch.randint(0, 4, (500, 4), generator=gen),
    )
    num = torch.randint(0, 5, (500,), generator=gen)
    out = accept_greedy(target, drafts, num)
    for i in range(500):
        n = int(out.num_accepted[i])
        assert out.tokens[i, : n + 1].tolist() == target[i, : n + 1].tolist()
        agree = [int(drafts[i, j]) == int(target[i, j]) for j in range(int(num[i]))]
        assert n == (agree.index(False) if False in agree else len(agree))


# ---- rejection sampling: the table ------------------------------------------------------

P = torch.tensor([[0.5, 0.3, 0.2], [0.1, 0.6, 0.3]])  # target at positions 0 and 1 (k = 1)
Q = torch.tensor([[0.25, 0.25, 0.5]])  # the draft's distribution at position 0


def one(drafts: int, u: float, noise: torch.Tensor, draft_probs: torch.Tensor | None):
    return accept_rejection(
        P[None], rows([drafts]), torch.tensor([1]), torch.tensor([[u]]), noise[None],
        None if draft_probs is None else draft_probs[None],
    )  # fmt: skip


FLAT = torch.ones(2, 3)  # equal noise: the race picks the argmax of what it is given


@pytest.mark.parametrize(
    ("draft", "u", "draft_probs", "accepted", "emitted", "why"),
    [
        # Point-mass draft: kept iff u < p(d).
        (0, 0.49, None, 1, [0, 1], "p(0) = 0.5 > u: kept; bonus = argmax p_1"),
        (0, 0.51, None, 0, [1, -1], "u > p(0): rejected; residual p_0 without 0 -> 1"),
        (2, 0.19, None, 1, [2, 1], "p(2) = 0.2 > u: kept"),
        # Drawn from Q: kept iff u < p(d) / q(d).
        (0, 0.99, Q, 1, [0, 1], "p(0)/q(0) = 2: always kept"),
        (2, 0.39, Q, 1, [2, 1], "p(2)/q(2) = 0.4 > u: kept"),
        (2, 0.41, Q, 0, [0, -1], "rejected; residual max(0, p - q) = (0.25, 0.05, 0) -> 0"),
    ],
)
def test_rejection_table(draft, u, draft_probs, accepted, emitted, why) -> None:
    out = one(draft, u, FLAT, draft_probs)
    assert out.num_accepted.tolist() == [accepted], why
    assert out.tokens.tolist() == [emitted], why


def test_a_draft_equal_to_the_target_leaves_no_residual_and_draws_from_the_target() -> None:
    same = P[:1].clone()
    out = accept_rejection(
        P[None], rows([1]), torch.tensor([1]), torch.tensor([[1.0]]), FLAT[None], same[None]
    )  # u = 1 can only reject; p == q has no residual mass: the draw falls back to p
    assert out.num_accepted.tolist() == [0] and out.tokens.tolist() == [[0, -1]]


# ---- rejection sampling: the distribution -----------------------------------------------

SAMPLES = 200_000


def tolerance(n: int, vocab: int) -> float:
    """The total variation allowed between ``n`` draws and their distribution: sampling
    error alone gives about ``sqrt(vocab / n) / 4`` (0.0014 for 200k draws over 6 tokens),
    this allows twice that plus 0.005; a sampler off by a draft's share (the classic bug:
    emitting the draft's distribution) is off by more than 0.1."""
    return 0.005 + (vocab / n) ** 0.5 / 2


def tv(counts: torch.Tensor, probs: torch.Tensor) -> float:
    return 0.5 * float((counts / counts.sum() - probs).abs().sum())


@pytest.mark.parametrize("point_mass", [False, True])
def test_every_emitted_token_is_distributed_as_the_target(point_mass: bool) -> None:
    gen = torch.Generator().manual_seed(1234)
    k, vocab = 3, 6
    target = torch.softmax(torch.randn(k + 1, vocab, generator=gen) * 1.5, dim=-1)
    draft = torch.softmax(torch.randn(k, vocab, generator=gen) * 1.5, dim=-1)
    if point_mass:  # a fixed draft at every position (n-gram): no distribution of its own
        drafts = target[:k].argmax(dim=-1).expand(SAMPLES, k)
        draft_probs = None
    else:
        drafts = torch.multinomial(draft, SAMPLES, replacement=True, generator=gen).T
        draft_probs = draft.expand(SAMPLES, k, vocab)
    out = accept_rejection(
        target.expand(SAMPLES, k + 1, vocab),
        drafts,
        torch.full((SAMPLES,), k),
        torch.rand(SAMPLES, k, generator=gen),
        torch.empty(SAMPLES, k + 1, vocab).exponential_(generator=gen),
        draft_probs,
    )
    # Positions are independent here (each target row stands for the prefix before it), so
    # the token emitted at position j, over the runs that reach j, must follow target[j].
    for j in range(k + 1):
        reached = out.num_accepted >= j
        counts = torch.bincount(out.tokens[reached, j], minlength=vocab).float()
        assert counts.sum() > 1000
        assert tv(counts, target[j]) < tolerance(int(counts.sum()), vocab), f"position {j}"
    # And the drafts' acceptance rate is the theory's: sum_v min(p, q) at position 0.
    expected = (
        float(target[0, drafts[0, 0]])
        if point_mass
        else float(torch.minimum(target[0], draft[0]).sum())
    )
    assert abs(float((out.num_accepted >= 1).float().mean()) - expected) < 0.01


def test_a_seeded_request_verifies_the_same_way_whatever_the_batch() -> None:
    k, vocab = 2, 5
    target = torch.softmax(
        torch.randn(k + 1, vocab, generator=torch.Generator().manual_seed(3)), -1
    )
    drafts = rows([1, 2])

    def run(seed: int, index: int) -> list[int]:
        u, noise = spec_noise(seed, index, k, vocab, torch.device("cpu"))
        out = accept_rejection(target[None], drafts, torch.tensor([k]), u[None], noise[None])
        return out.tokens[0].tolist()

    assert run(7, 10) == run(7, 10)
    draws = {tuple(run(seed, 10)) for seed in range(40)}
    assert len(draws) > 1  # the seed matters
    # The noise of output index i is the same whichever verification it falls in.
    _, a = spec_noise(7, 10, 2, vocab, torch.device("cpu"))
    _, b = spec_noise(7, 11, 1, vocab, torch.device("cpu"))
    assert torch.equal(a[1], b[0])


def test_shapes_that_do_not_fit_are_refused() -> None:
    with pytest.raises(ValueError, match="target_tokens"):
        accept_greedy(rows([1, 2]), rows([1, 2]), torch.tensor([2]))
    with pytest.raises(ValueError, match="draft_probs"):
        accept_rejection(
            P[None], rows([0]), torch.tensor([1]), torch.tensor([[0.5]]), FLAT[None],
            torch.ones(1, 1, 4),
        )  # fmt: skip
