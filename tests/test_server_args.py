"""ServerArgs: the prefill_delay property, validate() refusals and the CLI."""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from actors.server_args import (
    ATTENTION_BACKENDS,
    DEVICES,
    DISAGGREGATION_MODES,
    MOE_BACKENDS,
    ServerArgs,
)
from gate import PrefillDelay

ATTEMPT = "--prefill-attempt-interval"
ANY = "--prefill-any-attempt-interval"
GATE = {"prefill_attempt_interval": 4, "prefill_any_attempt_interval": 16}
GATE_CLI = [ATTEMPT, "4", ANY, "16"]


def flag_of(name: str) -> str:
    return "--" + name.replace("_", "-")


def refuses(flag: str) -> Any:
    return pytest.raises(ValueError, match=re.escape(flag))


# --- the prefill_delay property ---------------------------------------------------------------


def test_unset_pair_means_no_gate() -> None:
    args = ServerArgs()
    assert args.prefill_delay is None
    assert args.validate() is args


@pytest.mark.parametrize(("attempt", "any_"), [(1, 1), (4, 16), (8, 8)])
def test_complete_pair_gives_a_delay(attempt: int, any_: int) -> None:
    args = ServerArgs(prefill_attempt_interval=attempt, prefill_any_attempt_interval=any_)
    assert args.validate().prefill_delay == PrefillDelay(attempt, any_)


@pytest.mark.parametrize(
    ("attempt", "any_", "missing"),
    [(4, None, ANY), (None, 16, ATTEMPT), (1, None, ANY), (None, 1, ATTEMPT)],
)
def test_incomplete_pair_raises_at_property_and_validate(
    attempt: int | None, any_: int | None, missing: str
) -> None:
    args = ServerArgs(prefill_attempt_interval=attempt, prefill_any_attempt_interval=any_)
    with refuses(missing):
        _ = args.prefill_delay
    with refuses(missing):
        args.validate()


@pytest.mark.parametrize(
    ("field", "value", "flag"),
    [
        ("prefill_attempt_interval", None, ATTEMPT),
        ("prefill_any_attempt_interval", None, ANY),
        ("prefill_any_attempt_interval", 2, ANY),  # now below the attempt interval
        ("prefill_attempt_interval", 0, ATTEMPT),
    ],
)
def test_edit_after_validate_is_caught(field: str, value: int | None, flag: str) -> None:
    args = ServerArgs(**GATE).validate()
    setattr(args, field, value)
    with refuses(flag):
        _ = args.prefill_delay
    with refuses(flag):
        args.validate()


def test_property_follows_edits() -> None:
    args = ServerArgs(**GATE).validate()
    args.prefill_attempt_interval = 2
    assert args.prefill_delay == PrefillDelay(2, 16)
    args.prefill_attempt_interval = None
    args.prefill_any_attempt_interval = None
    assert args.prefill_delay is None


@pytest.mark.parametrize(("attempt", "any_"), [(4, 2), (16, 15), (2, 1)])
def test_any_below_attempt_is_refused(attempt: int, any_: int) -> None:
    args = ServerArgs(prefill_attempt_interval=attempt, prefill_any_attempt_interval=any_)
    with refuses(ANY):
        _ = args.prefill_delay
    with refuses(ANY):
        args.validate()


# --- validate() -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("changes", "flag"),
    [
        # The gate is for the fused role only.
        ({**GATE, "disaggregation_mode": "prefill"}, "--disaggregation-mode"),
        ({**GATE, "disaggregation_mode": "decode"}, "--disaggregation-mode"),
        # The gate and the local interval policy exclude each other.
        ({**GATE, "prefill_decode_interval": 1}, "--prefill-decode-interval"),
        ({**GATE, "prefill_decode_interval": 8}, "--prefill-decode-interval"),
        # Every rank needs a batch slot.
        ({"dp_size": 4, "max_num_seqs": 3}, "--max-num-seqs"),
        ({"dp_size": 8, "max_num_seqs": 1}, "--max-num-seqs"),
        # Plain range and choice checks.
        ({"dp_size": 0}, "--dp-size"),
        ({"max_num_seqs": 0}, "--max-num-seqs"),
        ({"max_scheduled_tokens": 0}, "--max-scheduled-tokens"),
        ({"page_size": -16}, "--page-size"),
        ({"num_kv_pages": 0}, "--num-kv-pages"),
        ({"stream_interval": 0}, "--stream-interval"),
        ({"dp_size": 2.0}, "--dp-size"),
        ({"dp_size": True}, "--dp-size"),
        ({"max_model_len": 0}, "--max-model-len"),
        ({"prefill_decode_interval": -1}, "--prefill-decode-interval"),
        ({"collective_timeout_s": 0.0}, "--collective-timeout-s"),
        ({"disaggregation_mode": "both"}, "--disaggregation-mode"),
        ({"device": "tpu"}, "--device"),
        ({"attention_backend": "xformers"}, "--attention-backend"),
        ({"moe_backend": "ep"}, "--moe-backend"),
    ],
)
def test_validate_refuses(changes: dict[str, Any], flag: str) -> None:
    with refuses(flag):
        ServerArgs(**changes).validate()
    # The same refusal reaches a validated instance edited afterwards.
    args = ServerArgs().validate()
    for name, value in changes.items():
        setattr(args, name, value)
    with refuses(flag):
        args.validate()


@pytest.mark.parametrize(
    "changes",
    [
        {**GATE, "disaggregation_mode": "null"},
        {"disaggregation_mode": "prefill"},
        {"disaggregation_mode": "decode", "prefill_decode_interval": 3},
        {"prefill_decode_interval": 4},
        {**GATE, "prefill_decode_interval": 0},
        {"dp_size": 4, "max_num_seqs": 4},
        {"max_model_len": 4096, "collective_timeout_s": 0.5, "enable_mixed_prefill_decode": True},
    ],
)
def test_validate_accepts(changes: dict[str, Any]) -> None:
    args = ServerArgs(**changes)
    assert args.validate() is args


@pytest.mark.parametrize(
    ("changes", "flag"),
    [
        ({"prefill_decode_interval": None}, "--prefill-decode-interval"),
        ({"max_model_len": "4096"}, "--max-model-len"),
        ({"collective_timeout_s": "30"}, "--collective-timeout-s"),
    ],
)
def test_wrong_types_name_the_flag(changes: dict[str, Any], flag: str) -> None:
    with refuses(flag):
        ServerArgs(**changes).validate()


def test_replace_validates() -> None:
    args = ServerArgs(**GATE).validate()
    assert args.replace(dp_size=2).dp_size == 2
    with refuses("--disaggregation-mode"):
        args.replace(disaggregation_mode="prefill")
    assert args.disaggregation_mode == "null"  # the original is untouched


@pytest.mark.parametrize(
    ("max_num_seqs", "dp_size", "expected"),
    [(64, 1, 64), (64, 4, 16), (7, 2, 3), (8, 8, 1), (100, 8, 12)],
)
def test_max_batch_size(max_num_seqs: int, dp_size: int, expected: int) -> None:
    args = ServerArgs(max_num_seqs=max_num_seqs, dp_size=dp_size).validate()
    assert args.max_batch_size == expected


# --- the CLI ----------------------------------------------------------------------------------


def test_from_cli_parses_the_design_flags() -> None:
    args = ServerArgs.from_cli(
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
            "8192",
            "--collective-timeout-s",
            "2.5",
        ]
    )
    assert args.prefill_delay == PrefillDelay(4, 16)
    assert (args.dp_size, args.max_num_seqs, args.max_batch_size) == (4, 128, 32)
    assert args.max_scheduled_tokens == 512
    assert args.enable_mixed_prefill_decode is True
    assert args.max_model_len == 8192
    assert args.collective_timeout_s == 2.5


def test_from_cli_defaults_equal_the_dataclass() -> None:
    assert ServerArgs.from_cli([]) == ServerArgs()


@pytest.mark.parametrize(
    "changes",
    [
        {},
        GATE,
        {"prefill_decode_interval": 2, "disaggregation_mode": "prefill"},
        {"dp_size": 8, "max_num_seqs": 256, "enable_mixed_prefill_decode": True},
        {"max_model_len": 2048, "seed": -3, "collective_timeout_s": 0.25, "model": "tiny-llama"},
        {"device": "cuda", "attention_backend": "flashinfer", "moe_backend": "deepep"},
    ],
)
def test_cli_round_trip(changes: dict[str, Any]) -> None:
    args = ServerArgs(**changes).validate()
    assert ServerArgs.from_cli(args.to_cli()) == args


@st.composite
def valid_args(draw: st.DrawFn) -> ServerArgs:
    dp_size = draw(st.integers(1, 16))
    gate = draw(st.booleans())
    attempt = draw(st.integers(1, 32))
    mode = "null" if gate else draw(st.sampled_from(DISAGGREGATION_MODES))
    return ServerArgs(
        model=draw(st.sampled_from(["tiny-moe", "tiny-llama", "/models/my model"])),
        dp_size=dp_size,
        max_num_seqs=draw(st.integers(dp_size, 4096)),
        max_scheduled_tokens=draw(st.integers(1, 1 << 16)),
        page_size=draw(st.sampled_from([1, 16, 64])),
        num_kv_pages=draw(st.integers(1, 1 << 20)),
        max_model_len=draw(st.none() | st.integers(1, 1 << 17)),
        prefill_attempt_interval=attempt if gate else None,
        prefill_any_attempt_interval=draw(st.integers(attempt, 64)) if gate else None,
        prefill_decode_interval=0 if gate else draw(st.integers(0, 16)),
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
    ).validate()


@settings(max_examples=50, deadline=None)
@given(args=valid_args())
def test_cli_round_trip_property(args: ServerArgs) -> None:
    assert ServerArgs.from_cli(args.to_cli()) == args


def help_entries(capsys: pytest.CaptureFixture[str]) -> dict[str, str]:
    """``--help`` output as {first flag of an option: its whole entry, whitespace collapsed}."""
    with pytest.raises(SystemExit) as exit_info:
        ServerArgs.from_cli(["--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    options = out.split("options:", 1)[1]
    entries = re.split(r"\n  (?=-)", options)
    return {entry.split()[0].rstrip(","): " ".join(entry.split()) for entry in entries[1:]}


def test_help_lists_every_flag_with_its_default(capsys: pytest.CaptureFixture[str]) -> None:
    entries = help_entries(capsys)
    for f in dataclasses.fields(ServerArgs):
        flag = flag_of(f.name)
        assert flag in entries, f"{flag} missing from --help"
        assert f"(default: {f.default})" in entries[flag], entries[flag]


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
        ([*GATE_CLI, "--prefill-decode-interval", "2"], "--prefill-decode-interval"),
        (["--prefill-decode-interval", "-1"], "--prefill-decode-interval"),
        (["--dp-size", "8", "--max-num-seqs", "4"], "--max-num-seqs"),
        (["--max-model-len", "0"], "--max-model-len"),
    ],
)
def test_bad_cli_value_is_an_argparse_error_naming_the_flag(
    argv: list[str], flag: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        ServerArgs.from_cli(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: roundgate")
    assert flag in err
    assert "Traceback" not in err
