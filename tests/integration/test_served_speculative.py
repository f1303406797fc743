"""Speculative decoding served: local.yaml's model at dp=2 under the gate, with n-gram drafts
(``speculative_config``), answers greedy requests on both ranks token for token as the same
deployment without drafts does (logprobs within float rounding), keeps drafts on copy-heavy
prompts, and exports its acceptance per rank in ``/metrics``."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from roundgate.actors.telemetry.metrics_hub import PUSH_INTERVAL_S

MODEL = "smollm2-135m-instruct"
SPEC = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2}
PASSAGE = (
    "def area(width, height):\n    return width * height\n\n"
    "def perimeter(width, height):\n    return 2 * (width + height)\n"
)
# Copy-heavy (the answer repeats the prompt's code) and plain ones, two per rank.
PROMPTS = [
    f"Here is some code:\n{PASSAGE}\nThe same code again, unchanged:\n",
    f"Copy this text exactly.\nText: {PASSAGE}\nCopy: {PASSAGE[:20]}",
    "The capital of France is",
    "List three colors:",
]
TOKENS = 40


def complete_all(url: str) -> list[dict[str, Any]]:
    """Every prompt at once (pinned alternately to rank 0 and rank 1), greedy, logprobs."""

    def one(i: int) -> dict[str, Any]:
        body = {
            "model": MODEL,
            "prompt": PROMPTS[i],
            "max_tokens": TOKENS,
            "temperature": 0,
            "logprobs": 1,
            "dp_rank": i % 2,
        }
        r = httpx.post(f"{url}/v1/completions", json=body, timeout=300)
        assert r.status_code == 200, r.text
        return r.json()["choices"][0]

    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        return list(pool.map(one, range(len(PROMPTS))))


def spec_counters(
    url: str, until: str = "roundgate_spec_decode_accepted_tokens_total"
) -> dict[str, float]:
    """The group's speculative-decoding totals, once some rank has reported a kept draft.

    Ranks push their series to the metrics hub every second (``PUSH_INTERVAL_S``), so a
    scrape right after the last answer may still read the rounds before it: read again for
    a few pushes before reporting what is there."""
    deadline = time.monotonic() + 10 * PUSH_INTERVAL_S
    while True:
        text = httpx.get(f"{url}/metrics", timeout=30).raise_for_status().text
        totals: dict[str, float] = {}
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                if s.name.startswith("roundgate_spec_decode_") and s.name.endswith("_total"):
                    totals[s.name] = totals.get(s.name, 0.0) + s.value
        if totals.get(until) or (time.monotonic() > deadline):
            return totals
        time.sleep(PUSH_INTERVAL_S / 2)


@pytest.fixture(scope="module")
def answers(real_model: Any) -> Any:
    """The plain deployment's answers, then the speculative deployment (restored after)."""
    plain = complete_all(real_model.url)
    real_model.deploy(model=MODEL, elastic_dp=True, speculative_config=SPEC)
    yield real_model, plain
    real_model.deploy(model=MODEL, elastic_dp=True)


def test_speculative_greedy_equals_plain_greedy_on_both_ranks(answers: Any) -> None:
    app, plain = answers
    drafted = complete_all(app.url)
    for want, have in zip(plain, drafted, strict=True):
        assert have["text"] == want["text"]
        assert have["logprobs"]["tokens"] == want["logprobs"]["tokens"]
        assert have["logprobs"]["token_logprobs"] == pytest.approx(
            want["logprobs"]["token_logprobs"], abs=1e-4
        )
        assert have["finish_reason"] == want["finish_reason"]
    counters = spec_counters(app.url)
    drafts = counters.get("roundgate_spec_decode_draft_tokens_total", 0)
    kept = counters.get("roundgate_spec_decode_accepted_tokens_total", 0)
    assert drafts > 0 and 0 < kept <= drafts, counters
    # Each rank's own acceptance rate and tokens per verification, as gauges.
    text = httpx.get(f"{app.url}/metrics", timeout=30).raise_for_status().text
    gauges: dict[str, list[float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in (
                "roundgate_spec_decode_acceptance_rate",
                "roundgate_spec_decode_mean_accepted_length",
            ):
                gauges.setdefault(sample.name, []).append(sample.value)
    assert max(gauges["roundgate_spec_decode_acceptance_rate"]) > 0, gauges
    assert all(0 <= v <= 1 for v in gauges["roundgate_spec_decode_acceptance_rate"]), gauges
    assert max(gauges["roundgate_spec_decode_mean_accepted_length"]) > 1, gauges


def test_draft_model_greedy_equals_plain_greedy_on_both_ranks(answers: Any) -> None:
    """``draft_model``: the default model drafting for itself on each rank (k=3)."""
    app, plain = answers
    spec = {"method": "draft_model", "model": MODEL, "num_speculative_tokens": 3}
    app.deploy(model=MODEL, elastic_dp=True, speculative_config=spec)
    drafted = complete_all(app.url)
    for want, have in zip(plain, drafted, strict=True):
        assert have["text"] == want["text"]
        assert have["logprobs"]["tokens"] == want["logprobs"]["tokens"]
        assert have["finish_reason"] == want["finish_reason"]
    counters = spec_counters(app.url)
    assert counters.get("roundgate_spec_decode_accepted_tokens_total", 0) > 0, counters
