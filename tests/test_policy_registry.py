"""``--prefill-policy`` through ServerArgs and ``gate.registry``: which policy a config selects
(or implies), each policy's flags and defaults, the refusals (each naming its flag), the CLI."""

from __future__ import annotations

import re
from typing import Any

import pytest

from actors.server_args import ServerArgs
from gate import registry
from gate.delay import PrefillDelay
from gate.group_gate import GroupGate
from gate.local_interval import LocalIntervalConfig, LocalIntervalPolicy
from gate.no_gate import NoGate, NoGateConfig
from gate.sglang_delayer import SGLangDelayer, SGLangDelayerConfig
from gate.spec import PolicyContext
from gate.trtllm_balance import TrtllmBalance, TrtllmBalanceConfig
from gate.vllm_interval import VllmInterval, VllmIntervalConfig

GATE = {"prefill_attempt_interval": 4, "prefill_any_attempt_interval": 16}
# A small group: two ranks of 8 running requests each.
GROUP = {"dp_size": 2, "max_num_seqs": 16}
BUILTINS = (
    "roundgate",
    "none",
    "local-interval",
    "sglang-delayer",
    "vllm-interval",
    "trtllm-balance",
)
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
# A value of the right type for any flag (the foreign-flag check runs before range checks).
SAMPLE = {int: 2, float: 0.5, bool: True, str: "x"}


def make(**changes: Any) -> ServerArgs:
    return ServerArgs(**(GROUP | changes))


def refuses(text: str) -> Any:
    return pytest.raises(ValueError, match=re.escape(text))


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
    with refuses("--prefill-policy must be one of roundgate, none, local-interval"):
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


# ---- refusals, each naming the flag ----------------------------------------------------------


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"prefill_policy": "fastest"}, "--prefill-policy must be one of"),
        (
            {"prefill_policy": "roundgate"},
            "--prefill-policy roundgate needs --prefill-attempt-interval",
        ),
        ({"prefill_attempt_interval": 4}, "roundgate needs --prefill-any-attempt-interval"),
        ({"prefill_policy": "local-interval"}, "local-interval needs --prefill-decode-interval"),
        (
            {"prefill_policy": "none", **GATE},
            "--prefill-attempt-interval applies to --prefill-policy roundgate only "
            "(selected: none)",
        ),
        (
            {**GATE, "prefill_decode_interval": 2},
            "--prefill-decode-interval applies to --prefill-policy local-interval only "
            "(selected: roundgate)",
        ),
        (
            {"prefill_policy": "vllm-interval", "prefill_decode_interval": 2},
            "--prefill-decode-interval applies to --prefill-policy local-interval only "
            "(selected: vllm-interval)",
        ),
        (
            {"prefill_schedule_interval": 2},
            "--prefill-schedule-interval applies to --prefill-policy vllm-interval only "
            "(selected: none)",
        ),
        (
            {**GATE, "attention_dp_timeout_iters": 5},
            "--attention-dp-timeout-iters applies to --prefill-policy trtllm-balance only",
        ),
        (
            {"prefill_policy": "trtllm-balance", "prefill_delayer_max_delay_passes": 3},
            "--prefill-delayer-max-delay-passes applies to --prefill-policy sglang-delayer only",
        ),
        (
            {"prefill_policy": "sglang-delayer", "prefill_schedule_interval": 2},
            "--prefill-schedule-interval applies to --prefill-policy vllm-interval only",
        ),
        ({"prefill_decode_interval": 0}, "--prefill-decode-interval must be >= 1, got 0"),
        ({"prefill_decode_interval": -1}, "--prefill-decode-interval must be >= 1"),
        (
            {"prefill_attempt_interval": 0, "prefill_any_attempt_interval": 4},
            "--prefill-attempt-interval",
        ),
        (
            {"prefill_attempt_interval": 8, "prefill_any_attempt_interval": 4},
            "--prefill-any-attempt-interval (4) must be >= --prefill-attempt-interval (8)",
        ),
        (
            {"prefill_policy": "sglang-delayer", "prefill_delayer_max_delay_passes": 0},
            "--prefill-delayer-max-delay-passes must be >= 1",
        ),
        (
            {"prefill_policy": "sglang-delayer", "prefill_delayer_max_delay_passes": 2.5},
            "--prefill-delayer-max-delay-passes must be an integer",
        ),
        (
            {"prefill_policy": "sglang-delayer", "prefill_delayer_token_usage_low_watermark": 1.5},
            "--prefill-delayer-token-usage-low-watermark must be in [0, 1]",
        ),
        (
            {"prefill_policy": "vllm-interval", "prefill_schedule_interval": 0},
            "--prefill-schedule-interval must be an integer >= 1",
        ),
        (
            {"prefill_policy": "trtllm-balance", "attention_dp_batching_wait_iters": -1},
            "--attention-dp-batching-wait-iters must be >= 0",
        ),
        (
            {"prefill_policy": "trtllm-balance", "attention_dp_timeout_iters": 0},
            "--attention-dp-timeout-iters must be >= 1",
        ),
    ],
)
def test_refusals_name_the_flag(changes: dict[str, Any], message: str) -> None:
    with refuses(message):
        make(**changes)


@pytest.mark.parametrize("selected", BUILTINS)
def test_every_flag_of_another_policy_is_refused(selected: str) -> None:
    base = make(prefill_policy=selected, **_required(selected))
    for name, (flag, owner) in registry.all_flags().items():
        if owner == selected:
            continue
        expected = f"{flag.cli} applies to --prefill-policy {owner} only (selected: {selected})"
        with refuses(expected):
            base.replace(**{name: SAMPLE[flag.kind]})


@pytest.mark.parametrize("name", [n for n in BUILTINS if n != "none"])
@pytest.mark.parametrize("mode", ["prefill", "decode"])
def test_a_policy_needs_the_fused_role(name: str, mode: str) -> None:
    with refuses(f"--prefill-policy {name} applies to the fused role only; --disaggregation-mode"):
        make(prefill_policy=name, disaggregation_mode=mode, **_required(name))
    assert make(prefill_policy="none", disaggregation_mode=mode).prefill_policy_name == "none"


def _required(name: str) -> dict[str, Any]:
    """The selected policy's required flags at their simulate defaults."""
    return {flag.name: flag.sim_default for flag in registry.get(name).flags if flag.required}


# ---- the CLI ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "name", "config"),
    [
        ([], "none", NoGateConfig()),
        (
            ["--prefill-attempt-interval", "2", "--prefill-any-attempt-interval", "8"],
            "roundgate",
            PrefillDelay(2, 8),
        ),
        (["--prefill-decode-interval", "3"], "local-interval", LocalIntervalConfig(3)),
        (
            [
                "--prefill-policy",
                "sglang-delayer",
                "--prefill-delayer-token-usage-low-watermark",
                "0.8",
                "--prefill-delayer-queue-min-ratio",
                "0.5",
            ],
            "sglang-delayer",
            SGLangDelayerConfig(token_usage_low_watermark=0.8, queue_min_ratio=0.5),
        ),
        (
            ["--prefill-policy", "vllm-interval", "--prefill-schedule-interval", "2"],
            "vllm-interval",
            VllmIntervalConfig(2),
        ),
        (
            ["--prefill-policy", "trtllm-balance", "--attention-dp-timeout-iters", "7"],
            "trtllm-balance",
            TrtllmBalanceConfig(timeout_iters=7),
        ),
    ],
)
def test_cli_selects_a_policy_with_its_flags(argv: list[str], name: str, config: Any) -> None:
    args = ServerArgs.from_cli(["--dp-size", "4", "--max-num-seqs", "64", *argv])
    assert args.prefill_policy_name == name
    assert args.policy_config == config
    back = ServerArgs.from_cli(args.to_cli())
    assert back == args
    assert back.policy_config == config


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["--prefill-schedule-interval", "2"],
            "--prefill-schedule-interval applies to --prefill-policy vllm-interval",
        ),
        (["--prefill-decode-interval", "0"], "--prefill-decode-interval must be >= 1"),
        (["--prefill-policy", "roundgate"], "roundgate needs --prefill-attempt-interval"),
        (["--prefill-policy", "fastest"], "--prefill-policy"),
    ],
)
def test_cli_refusal_is_an_argparse_error(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        ServerArgs.from_cli(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert message in err
    assert "Traceback" not in err
