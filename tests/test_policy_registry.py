"""``--prefill-policy`` through ServerArgs and ``roundgate.gate.registry``: which policy a config
selects (or implies), each policy's flags and defaults."""

from __future__ import annotations

from typing import Any

import pytest
from policy_cases import BUILTINS, GATE, make, refuses

from roundgate.gate import registry
from roundgate.gate.delay import PrefillDelay
from roundgate.gate.group_gate import GroupGate
from roundgate.gate.local_interval import LocalIntervalConfig, LocalIntervalPolicy
from roundgate.gate.no_gate import NoGate, NoGateConfig
from roundgate.gate.sglang_delayer import SGLangDelayer, SGLangDelayerConfig
from roundgate.gate.spec import PolicyContext
from roundgate.gate.trtllm_balance import TrtllmBalance, TrtllmBalanceConfig
from roundgate.gate.vllm_interval import VllmInterval, VllmIntervalConfig

# Each built-in policy's flags, in declaration order.
FLAGS = {
    "roundgate": ("prefill_attempt_interval", "prefill_any_attempt_interval"),
    "none": (),
    "local-interval": ("prefill_decode_interval",),
    "sglang-delayer": (
        "prefill_delayer_max_delay_passes",
        "prefill_delayer_token_usage_low_watermark",
        "prefill_delayer_queue_min_ratio",
        "prefill_delayer_max_delay_ms",
        "prefill_delayer_prefill_max_requests",
    ),
    "vllm-interval": ("prefill_schedule_interval",),
    "trtllm-balance": ("attention_dp_timeout_iters", "attention_dp_batching_wait_iters"),
}


# ---- the registry ------------------------------------------------------------------------


def test_the_builtins_come_first_with_their_flags() -> None:
    assert registry.names()[: len(BUILTINS)] == BUILTINS
    for name, flags in FLAGS.items():
        spec = registry.get(name)
        assert spec.name == name
        assert tuple(flag.name for flag in spec.flags) == flags
    owners = {flag: owner for flag, (_, owner) in registry.all_flags().items()}
    assert {flag: owners[flag] for names in FLAGS.values() for flag in names} == {
        flag: name for name, names in FLAGS.items() for flag in names
    }


def test_unknown_policy_names_the_choices() -> None:
    with refuses("--prefill-policy must be one of roundgate, roundgate-auto, none, local-interval"):
        registry.get("fastest")


@pytest.mark.parametrize(
    ("given", "implied"),
    [
        ({}, "none"),
        (GATE, "roundgate"),
        ({"prefill_attempt_interval": 4}, "roundgate"),  # then refused for the missing one
        ({"prefill_any_attempt_interval": 16}, "roundgate"),
        ({"prefill_decode_interval": 3}, "local-interval"),
        # Flags with defaults imply nothing: those policies are selected by name only.
        ({"prefill_schedule_interval": 2}, "none"),
        ({"prefill_delayer_max_delay_passes": 3}, "none"),
        ({"attention_dp_timeout_iters": 5}, "none"),
    ],
)
def test_implied_policy(given: dict[str, Any], implied: str) -> None:
    assert registry.implied_policy(given) == implied


# ---- selection and derivation --------------------------------------------------------------


@pytest.mark.parametrize(
    ("changes", "name", "kind", "config"),
    [
        ({}, "none", NoGate, NoGateConfig()),
        (GATE, "roundgate", GroupGate, PrefillDelay(4, 16)),
        (
            {"prefill_decode_interval": 3},
            "local-interval",
            LocalIntervalPolicy,
            LocalIntervalConfig(3),
        ),
        ({"prefill_policy": "roundgate", **GATE}, "roundgate", GroupGate, PrefillDelay(4, 16)),
        ({"prefill_policy": "none"}, "none", NoGate, NoGateConfig()),
        (
            {"prefill_policy": "local-interval", "prefill_decode_interval": 1},
            "local-interval",
            LocalIntervalPolicy,
            LocalIntervalConfig(1),
        ),
        (
            {"prefill_policy": "sglang-delayer"},
            "sglang-delayer",
            SGLangDelayer,
            SGLangDelayerConfig(),
        ),
        ({"prefill_policy": "vllm-interval"}, "vllm-interval", VllmInterval, VllmIntervalConfig()),
        (
            {"prefill_policy": "trtllm-balance"},
            "trtllm-balance",
            TrtllmBalance,
            TrtllmBalanceConfig(),
        ),
    ],
)
def test_policy_is_selected_or_derived(
    changes: dict[str, Any], name: str, kind: type, config: Any
) -> None:
    args = make(**changes)
    assert args.prefill_policy_name == name
    assert args.policy_config == config
    policies = [args.build_policy(rank) for rank in range(args.dp_size)]
    assert all(type(policy) is kind for policy in policies)
    assert policies[0] is not policies[1]  # one policy object (and state) per rank
    # The registry builds the same policy from the same flags.
    ctx = PolicyContext(1, args.dp_size, args.max_batch_size)
    assert type(registry.build(name, args.policy_flags, ctx)) is kind


# ---- each policy's defaults: the peers' own --------------------------------------------------


@pytest.mark.parametrize(
    ("policy", "attributes"),
    [
        (
            "sglang-delayer",
            {
                "config.max_delay_passes": 30,
                "config.max_delay_ms": 5000.0,
                "config.token_usage_low_watermark": None,
                "config.queue_min_ratio": None,
                "config.prefill_max_requests": None,
                "max_running_requests": 8,  # SGLang's per-rank MRR = max_num_seqs // dp_size
            },
        ),
        (
            "trtllm-balance",
            {
                "config.timeout_iters": 50,
                "config.batching_wait_iters": 10,
                "max_batch_size": 8,  # the per-rank batch limit
            },
        ),
        ("vllm-interval", {"interval": 1, "rank": 1}),  # 1 = no throttling
    ],
)
def test_peer_defaults_are_the_peers_own(policy: str, attributes: dict[str, Any]) -> None:
    built = make(prefill_policy=policy).build_policy(1)
    for path, expected in attributes.items():
        value: Any = built
        for part in path.split("."):
            value = getattr(value, part)
        assert value == expected, path


@pytest.mark.parametrize(
    ("changes", "attributes"),
    [
        (GATE, {"delay": PrefillDelay(4, 16), "rounds_since_prefill": 0}),
        ({"prefill_decode_interval": 3}, {"interval": 3, "rank": 1, "remaining": 0}),
        (
            {"prefill_policy": "vllm-interval", "prefill_schedule_interval": 4},
            {"interval": 4, "rank": 1},
        ),
        (
            {"prefill_policy": "sglang-delayer", "prefill_delayer_max_delay_passes": 5},
            {"config": SGLangDelayerConfig(max_delay_passes=5), "max_running_requests": 8},
        ),
        (
            {"prefill_policy": "trtllm-balance", "attention_dp_batching_wait_iters": 0},
            {"config": TrtllmBalanceConfig(batching_wait_iters=0), "max_batch_size": 8},
        ),
    ],
)
def test_given_flags_reach_the_built_policy(
    changes: dict[str, Any], attributes: dict[str, Any]
) -> None:
    built = make(**changes).build_policy(1)
    assert {name: getattr(built, name) for name in attributes} == attributes


@pytest.mark.parametrize(
    ("name", "sim_defaults"),
    [
        ("roundgate", {"prefill_attempt_interval": 4, "prefill_any_attempt_interval": 16}),
        ("local-interval", {"prefill_decode_interval": 4}),
        ("vllm-interval", {"prefill_schedule_interval": 2}),
        (
            "trtllm-balance",
            {"attention_dp_timeout_iters": 50, "attention_dp_batching_wait_iters": 10},
        ),
    ],
)
def test_simulate_defaults_come_from_the_config(name: str, sim_defaults: dict[str, Any]) -> None:
    flags = {flag.name: flag.sim_default for flag in registry.get(name).flags}
    assert flags == sim_defaults
