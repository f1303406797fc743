"""``--prefill-policy`` in ServerArgs: derivation, each policy's own flags, refusals, the CLI."""

from __future__ import annotations

import pytest

from actors.policy_args import build_policy_for
from actors.server_args import ServerArgs
from gate.group_gate import GroupGate
from gate.local_interval import LocalIntervalPolicy
from gate.policy import NoGate
from gate.sglang_delayer import SGLangDelayer
from gate.trtllm_balance import TrtllmBalance
from gate.vllm_interval import VllmInterval

GATE = {"prefill_attempt_interval": 4, "prefill_any_attempt_interval": 16}


@pytest.mark.parametrize(
    ("changes", "name", "kind"),
    [
        ({}, "none", NoGate),
        (GATE, "roundgate", GroupGate),
        ({"prefill_decode_interval": 3}, "local-interval", LocalIntervalPolicy),
        ({"prefill_policy": "roundgate", **GATE}, "roundgate", GroupGate),
        ({"prefill_policy": "none"}, "none", NoGate),
        ({"prefill_policy": "sglang-delayer"}, "sglang-delayer", SGLangDelayer),
        ({"prefill_policy": "vllm-interval"}, "vllm-interval", VllmInterval),
        ({"prefill_policy": "trtllm-balance"}, "trtllm-balance", TrtllmBalance),
    ],
)
def test_policy_is_selected_or_derived(changes: dict, name: str, kind: type) -> None:
    args = ServerArgs(dp_size=2, max_num_seqs=16, **changes).validate()
    assert args.prefill_policy_name == name
    assert isinstance(build_policy_for(args, 1), kind)


def test_peer_defaults_are_the_peers_own() -> None:
    args = ServerArgs(dp_size=2, max_num_seqs=16, prefill_policy="sglang-delayer").validate()
    sglang = build_policy_for(args, 0).config
    assert (sglang.max_delay_passes, sglang.max_delay_ms) == (30, 5000.0)
    assert sglang.token_usage_low_watermark is None and sglang.queue_min_ratio is None
    assert sglang.max_running_requests == 8  # per-rank MRR = max_num_seqs // dp_size
    trt = build_policy_for(args.replace(prefill_policy="trtllm-balance"), 0).config
    assert (trt.timeout_iters, trt.batching_wait_iters, trt.max_batch_size) == (50, 10, 8)
    vllm = build_policy_for(args.replace(prefill_policy="vllm-interval"), 1)
    assert (vllm.interval, vllm.rank) == (1, 1)


@pytest.mark.parametrize(
    ("changes", "flag"),
    [
        ({"prefill_policy": "fastest"}, "--prefill-policy"),
        ({"prefill_policy": "roundgate"}, "--prefill-attempt-interval"),
        ({"prefill_policy": "local-interval"}, "--prefill-decode-interval"),
        ({"prefill_policy": "none", **GATE}, "--prefill-attempt-interval"),
        (
            {"prefill_policy": "vllm-interval", "prefill_decode_interval": 2},
            "--prefill-decode-interval",
        ),
        ({"prefill_schedule_interval": 2}, "--prefill-schedule-interval"),
        ({**GATE, "attention_dp_timeout_iters": 5}, "--attention-dp-timeout-iters"),
        (
            {"prefill_policy": "trtllm-balance", "prefill_delayer_max_delay_passes": 3},
            "--prefill-delayer-max-delay-passes",
        ),
        (
            {"prefill_policy": "sglang-delayer", "prefill_schedule_interval": 2},
            "--prefill-schedule-interval",
        ),
        (
            {"prefill_policy": "sglang-delayer", "prefill_delayer_max_delay_passes": 0},
            "--prefill-delayer-max-delay-passes",
        ),
        (
            {"prefill_policy": "sglang-delayer", "prefill_delayer_max_delay_passes": 2.5},
            "--prefill-delayer-max-delay-passes",
        ),
        (
            {"prefill_policy": "vllm-interval", "prefill_schedule_interval": 0},
            "--prefill-schedule-interval",
        ),
        (
            {"prefill_policy": "trtllm-balance", "attention_dp_batching_wait_iters": -1},
            "--attention-dp-batching-wait-iters",
        ),
    ],
)
def test_validate_refuses_naming_the_flag(changes: dict, flag: str) -> None:
    with pytest.raises(ValueError, match=flag):
        ServerArgs(**changes).validate()


def test_cli_selects_a_peer_with_its_flags() -> None:
    args = ServerArgs.from_cli(
        [
            "--dp-size",
            "4",
            "--max-num-seqs",
            "64",
            "--prefill-policy",
            "sglang-delayer",
            "--prefill-delayer-token-usage-low-watermark",
            "0.8",
            "--prefill-delayer-queue-min-ratio",
            "0.5",
        ]
    )
    config = build_policy_for(args, 0).config
    assert (config.token_usage_low_watermark, config.queue_min_ratio) == (0.8, 0.5)
    assert ServerArgs.from_cli(args.to_cli()) == args


def test_cli_refusal_is_an_argparse_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        ServerArgs.from_cli(["--prefill-schedule-interval", "2"])
    assert exit_info.value.code == 2
    assert "--prefill-schedule-interval applies to --prefill-policy vllm-interval" in (
        capsys.readouterr().err
    )
