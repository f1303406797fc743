"""``--prefill-policy`` refusals, each naming its flag, and the policy flags on the CLI."""

from __future__ import annotations

from typing import Any

import pytest
from policy_cases import BUILTINS, GATE, make, refuses

from roundgate.cli.engine_flags import parse_server_args, to_argv
from roundgate.gate import registry
from roundgate.gate.delay import PrefillDelay
from roundgate.gate.local_interval import LocalIntervalConfig
from roundgate.gate.no_gate import NoGateConfig
from roundgate.gate.sglang_delayer import SGLangDelayerConfig
from roundgate.gate.trtllm_balance import TrtllmBalanceConfig
from roundgate.gate.vllm_interval import VllmIntervalConfig

# A value of the right type for any flag (the foreign-flag check runs before range checks).
SAMPLE = {int: 2, float: 0.5, bool: True, str: "x"}


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
    args = parse_server_args(["--dp-size", "4", "--max-num-seqs", "64", *argv])
    assert args.prefill_policy_name == name
    assert args.policy_config == config
    back = parse_server_args(to_argv(args))
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
        parse_server_args(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert message in err
    assert "Traceback" not in err
