"""The peers, run in the simulator on scattered arrivals, do their job (PEER_POLICIES.md:
"a policy whose figures equal none's on a workload with scattered arrivals is not doing its
job"). Each decides one round late, as our gate does, so a fresh prompt is published before
it is decided on; each must then protect decode rounds that ``none`` gives away."""

from __future__ import annotations

import pytest
from sim_builders import make_spec, simulate

from roundgate.sim.round_costs import PRESETS

# Poisson arrivals spread by round-robin over 4 ranks: most rounds see one fresh prompt.
SCATTERED = make_spec(num_requests=80, rate=30.0, input_len=120, output_len=24)


@pytest.fixture(scope="module")
def none_summary() -> dict:
    return simulate("none", SCATTERED, costs=PRESETS["h100-dsv3"])


@pytest.mark.parametrize("policy", ["sglang-delayer", "vllm-interval", "trtllm-balance"])
def test_peer_differs_from_none_and_protects_decode_rounds(policy: str, none_summary) -> None:
    summary = simulate(policy, SCATTERED, costs=PRESETS["h100-dsv3"])
    assert summary["unfinished"] == 0
    # More of the busy rounds are decode-only, and a prompt waits for the policy.
    assert summary["decode_round_fraction"] > none_summary["decode_round_fraction"]
    assert summary["ttft_ms"]["p50"] > none_summary["ttft_ms"]["p50"]
    assert summary["max_admission_wait_rounds"] >= 1


def test_sglang_holds_a_lone_prompt_at_most_its_pass_limit(none_summary) -> None:
    """A prompt alone in the group is "mixed" prefillable: delayed, but never past P."""
    passes = 5
    summary = simulate(
        "sglang-delayer",
        SCATTERED,
        costs=PRESETS["h100-dsv3"],
        prefill_delayer_max_delay_passes=passes,
    )
    assert 1 <= summary["max_admission_wait_rounds"] <= passes + 1  # +1: the publishing round
    assert summary["max_admission_wait_rounds"] > none_summary["max_admission_wait_rounds"]
