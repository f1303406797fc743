"""ServerArgs on the command line: parsing, round trips, ``--help`` and argparse errors."""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from server_args_cases import ANY, ATTEMPT, CONTEXT, GATE, GATE_CLI, LOCAL_ONLY, flag_of

from roundgate.actors.model.config import PRESETS
from roundgate.actors.role import DISAGGREGATION_MODES, DisaggregationRole
from roundgate.actors.server_args import ATTENTION_BACKENDS, DEVICES, MOE_BACKENDS, ServerArgs
from roundgate.cli.engine_flags import parse_server_args, to_argv
from roundgate.gate import registry
from roundgate.gate.delay import PrefillDelay

# --- the CLI ----------------------------------------------------------------------------------


def test_from_cli_parses_the_design_flags() -> None:
    args = parse_server_args(
        [
            *GATE_CLI,
            "--dp-size",
            "4",
            "--max-num-seqs",
            "128",
            "--max-scheduled-tokens",
            "512",
            "--enable-mixed-prefill-decode",
            "--disaggregation-mode",
            "null",
            "--max-model-len",
            "2048",
            "--collective-timeout-s",
            "2.5",
        ]
    )
    assert args.prefill_policy_name == "roundgate"
    assert args.policy_config == PrefillDelay(4, 16)
    assert (args.dp_size, args.max_num_seqs, args.max_batch_size) == (4, 128, 32)
    assert args.max_scheduled_tokens == 512
    assert args.enable_mixed_prefill_decode is True
    assert args.max_model_len == 2048
    assert args.collective_timeout_s == 2.5


@pytest.mark.parametrize("spelling", ["null", "fused"])
def test_the_fused_role_takes_both_spellings_on_the_command_line(spelling: str) -> None:
    args = parse_server_args(["--disaggregation-mode", spelling])
    assert args.disaggregation_mode is DisaggregationRole.FUSED
    assert args == ServerArgs()


def test_from_cli_defaults_equal_the_dataclass() -> None:
    args = parse_server_args([])
    assert args == ServerArgs()
    assert args.max_model_len == CONTEXT
    assert dict(args.policy_flags) == {}


@pytest.mark.parametrize(
    "changes",
    [
        {},
        GATE,
        {"prefill_decode_interval": 2},
        {"disaggregation_mode": "prefill"},
        {"prefill_policy": "vllm-interval", "prefill_schedule_interval": 3},
        {"dp_size": 8, "max_num_seqs": 256, "enable_mixed_prefill_decode": True},
        {"max_model_len": 2048, "seed": -3, "collective_timeout_s": 0.25, "model": "tiny-llama"},
        {"device": "cuda", "attention_backend": "flashinfer", "moe_backend": "deepep"},
    ],
)
def test_cli_round_trip(changes: dict[str, Any]) -> None:
    args = ServerArgs(**changes)
    assert parse_server_args(to_argv(args)) == args


@st.composite
def valid_args(draw: st.DrawFn) -> ServerArgs:
    dp_size = draw(st.integers(1, 16))
    policy = draw(st.sampled_from(["none", "roundgate", "local-interval"]))
    attempt = draw(st.integers(1, 32))
    flags: dict[str, Any] = {}
    if policy == "roundgate":
        flags = {
            "prefill_attempt_interval": attempt,
            "prefill_any_attempt_interval": draw(st.integers(attempt, 64)),
        }
    elif policy == "local-interval":
        flags = {"prefill_decode_interval": draw(st.integers(1, 16))}
    # A prefill policy runs in the fused role only.
    mode = "null" if flags else draw(st.sampled_from(DISAGGREGATION_MODES))
    return ServerArgs(
        model=draw(st.sampled_from(sorted(PRESETS))),
        dp_size=dp_size,
        max_num_seqs=draw(st.integers(dp_size, 4096)),
        max_scheduled_tokens=draw(st.integers(1, 1 << 16)),
        page_size=draw(st.sampled_from([1, 16, 64])),
        num_kv_pages=draw(st.integers(1, 1 << 20)),
        max_model_len=draw(st.none() | st.integers(1, CONTEXT)),
        prefill_policy=draw(st.sampled_from([None, policy])),
        enable_mixed_prefill_decode=draw(st.booleans()),
        disaggregation_mode=mode,
        device=draw(st.sampled_from(DEVICES)),
        attention_backend=draw(st.sampled_from(ATTENTION_BACKENDS)),
        moe_backend=draw(st.sampled_from(MOE_BACKENDS)),
        seed=draw(st.integers(-(2**31), 2**31)),
        stream_interval=draw(st.integers(1, 64)),
        collective_timeout_s=draw(
            st.floats(min_value=1e-3, max_value=1e4, allow_nan=False, allow_infinity=False)
        ),
        **flags,
    )


@settings(max_examples=50, deadline=None)
@given(args=valid_args())
def test_cli_round_trip_property(args: ServerArgs) -> None:
    back = parse_server_args(to_argv(args))
    assert back == args
    assert back.prefill_policy_name == args.prefill_policy_name
    assert back.policy_config == args.policy_config


def help_entries(capsys: pytest.CaptureFixture[str]) -> dict[str, str]:
    """``--help`` output as {first flag of an option: its whole entry, whitespace collapsed}."""
    with pytest.raises(SystemExit) as exit_info:
        parse_server_args(["--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    options = out.split("options:", 1)[1]
    entries = re.split(r"\n  (?=-)", options)
    return {entry.split()[0].rstrip(","): " ".join(entry.split()) for entry in entries[1:]}


def test_help_lists_every_flag_with_its_default(capsys: pytest.CaptureFixture[str]) -> None:
    entries = help_entries(capsys)
    for f in dataclasses.fields(ServerArgs):
        if f.name == "policy_flags" or not f.init:
            continue  # the registered policies' flags (checked below) and derived fields
        flag = flag_of(f.name)
        assert flag in entries, f"{flag} missing from --help"
        assert f"(default: {f.default})" in entries[flag], entries[flag]


def test_help_lists_every_policy_flag_with_its_owner(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "400")  # no wrapping inside "sglang-delayer"
    entries = help_entries(capsys)
    assert "--policy-flags" not in entries
    for flag, owner in registry.all_flags().values():
        assert flag.cli in entries, f"{flag.cli} missing from --help"
        default = "required" if flag.required else f"default {flag.default}"
        assert f"(--prefill-policy {owner}; {default})" in entries[flag.cli], entries[flag.cli]


def test_help_prints_each_default_once(capsys: pytest.CaptureFixture[str]) -> None:
    for flag, entry in help_entries(capsys).items():
        if flag != "-h":
            assert entry.count("(default:") == 1, entry


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["--dp-size", "two"], "--dp-size"),
        (["--dp-size", "0"], "--dp-size"),
        (["--max-num-seqs", "1.5"], "--max-num-seqs"),
        (["--collective-timeout-s", "soon"], "--collective-timeout-s"),
        (["--disaggregation-mode", "both"], "--disaggregation-mode"),
        (["--device", "tpu"], "--device"),
        ([ATTEMPT, "4"], ANY),
        ([ANY, "16"], ATTEMPT),
        ([ATTEMPT, "8", ANY, "4"], ANY),
        ([ATTEMPT, "0", ANY, "4"], ATTEMPT),
        ([ATTEMPT, "x", ANY, "4"], ATTEMPT),
        ([*GATE_CLI, "--disaggregation-mode", "prefill"], "--disaggregation-mode"),
        ([*GATE_CLI, "--disaggregation-mode", "decode"], "--disaggregation-mode"),
        ([*GATE_CLI, "--prefill-decode-interval", "2"], LOCAL_ONLY + " (selected: roundgate)"),
        (["--prefill-decode-interval", "-1"], "--prefill-decode-interval"),
        (["--prefill-decode-interval", "0"], "--prefill-decode-interval"),
        (
            ["--prefill-decode-interval", "2", "--disaggregation-mode", "decode"],
            "--disaggregation-mode",
        ),
        (["--dp-size", "8", "--max-num-seqs", "4"], "--max-num-seqs"),
        (["--max-model-len", "0"], "--max-model-len"),
        (["--max-model-len", "8192"], "--max-model-len 8192 exceeds"),
        (["--prefill-policy", "fastest"], "--prefill-policy"),
    ],
)
def test_bad_cli_value_is_an_argparse_error_naming_the_flag(
    argv: list[str], flag: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        parse_server_args(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: roundgate")
    assert flag in err
    assert "Traceback" not in err
