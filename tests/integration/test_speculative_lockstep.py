"""Speculative decoding keeps a MoE group in lockstep: the tiny MoE preset at dp=2 has its
experts sharded over both ranks, so every forward is a collective of both. Rank 0 verifies
drafts on copy-heavy prompts while rank 1 decodes prompts with nothing to copy (and then
idles): if a verifying rank ran a forward its peer did not, the expert all-to-all would
hang and these requests would time out. Greedy answers equal the plain deployment's."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
from test_served_speculative import spec_counters

SPEC = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1}
COPY = [11, 12, 13, 14, 15, 16, 17, 18]
# (prompt token ids, rank, max_tokens): three copy-heavy ones on rank 0, two others on rank 1.
REQUESTS = [
    (COPY * 3, 0, 48),
    ([*COPY, 20, 21, *COPY], 0, 40),
    ([30, 31, 30, 31, 30, 31], 0, 44),
    ([101, 57, 203, 9, 77], 1, 12),
    ([45, 190, 3, 128], 1, 6),
]


def run_all(url: str) -> list[list[int]]:
    def one(spec: tuple[list[int], int, int]) -> list[int]:
        prompt, rank, max_tokens = spec
        body = {
            "prompt": prompt,
            "max_tokens": max_tokens,
            "temperature": 0,
            "ignore_eos": True,
            "dp_rank": rank,
            "return_token_ids": True,
        }
        # A hung collective would stall far past this (the group's collective timeout is 30s).
        r = httpx.post(f"{url}/v1/completions", json=body, timeout=120)
        assert r.status_code == 200, r.text
        return r.json()["choices"][0]["token_ids"]

    with ThreadPoolExecutor(len(REQUESTS)) as pool:
        return list(pool.map(one, REQUESTS))


def test_a_verifying_rank_and_a_plain_rank_stay_in_lockstep(redeploy: Any) -> None:
    plain = run_all(redeploy.url)
    redeploy.deploy(speculative_config=SPEC)
    drafted = run_all(redeploy.url)
    assert drafted == plain
    counters = spec_counters(redeploy.url)
    assert counters.get("roundgate_spec_decode_accepted_tokens_total", 0) > 0, counters
