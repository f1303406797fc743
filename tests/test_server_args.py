"""ServerArgs: frozen and validated at construction, ``replace``, the context length."""

from __future__ import annotations

import dataclasses
import json
import pickle
from pathlib import Path
from typing import Any

import pytest
from server_args_cases import ANY, ATTEMPT, CONTEXT, GATE, LOCAL_ONLY, refuses

from roundgate.actors.model.config import PRESETS, with_overrides
from roundgate.actors.role import DisaggregationRole
from roundgate.actors.server_args import ServerArgs
from roundgate.cli.engine_flags import parse_server_args, to_argv
from roundgate.gate.delay import PrefillDelay
from roundgate.gate.no_gate import NoGateConfig
from roundgate.gate.vllm_interval import VllmIntervalConfig

# --- frozen: no assignment, ``replace`` builds a validated copy ---------------------------------


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("dp_size", 2),
        ("max_model_len", 1024),
        ("disaggregation_mode", "prefill"),
        ("prefill_policy", "none"),
        ("prefill_attempt_interval", 2),  # a policy flag is no more assignable than a field
        ("prefill_decode_interval", 3),
        ("policy_flags", {}),
    ],
)
def test_assignment_is_refused(name: str, value: Any) -> None:
    args = ServerArgs(**GATE)
    before = args.to_dict()
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(args, name, value)
    assert args.to_dict() == before
    assert args.policy_config == PrefillDelay(4, 16)


def test_policy_flags_cannot_be_edited_in_place() -> None:
    args = ServerArgs(**GATE)
    with pytest.raises(TypeError):
        args.policy_flags["prefill_attempt_interval"] = 8  # type: ignore[index]
    assert args.policy_flags["prefill_attempt_interval"] == 4


def test_replace_returns_a_validated_copy() -> None:
    args = ServerArgs(**GATE)
    wider = args.replace(dp_size=2, max_num_seqs=8)
    assert wider is not args
    assert (wider.dp_size, wider.max_batch_size) == (2, 4)
    assert wider.policy_config == args.policy_config == PrefillDelay(4, 16)
    assert args.dp_size == 1  # the original is untouched
    assert args.replace() == args
    shorter = args.replace(prefill_attempt_interval=2)
    assert shorter.policy_config == PrefillDelay(2, 16)
    assert args.policy_config == PrefillDelay(4, 16)


def test_replace_with_none_unsets_a_policy_flag() -> None:
    args = ServerArgs(**GATE).replace(
        prefill_attempt_interval=None, prefill_any_attempt_interval=None
    )
    assert dict(args.policy_flags) == {}
    assert args.prefill_delay is None
    assert args.prefill_policy_name == "none"
    assert args == ServerArgs()


@pytest.mark.parametrize(
    ("changes", "flag"),
    [
        ({"prefill_attempt_interval": None}, ATTEMPT),
        ({"prefill_any_attempt_interval": None}, ANY),
        ({"prefill_any_attempt_interval": 2}, ANY),  # now below the attempt interval
        ({"prefill_attempt_interval": 0}, ATTEMPT),
        ({"disaggregation_mode": "prefill"}, "--disaggregation-mode"),
        ({"prefill_decode_interval": 2}, LOCAL_ONLY + " (selected: roundgate)"),
        ({"max_model_len": CONTEXT + 1}, "--max-model-len"),
    ],
)
def test_replace_validates(changes: dict[str, Any], flag: str) -> None:
    args = ServerArgs(**GATE)
    with refuses(flag):
        args.replace(**changes)
    assert args.to_dict() == ServerArgs(**GATE).to_dict()


# --- the gate's pair of intervals ---------------------------------------------------------------


def test_unset_pair_means_no_gate() -> None:
    args = ServerArgs()
    assert args.prefill_policy_name == "none"
    assert args.policy_config == NoGateConfig()
    assert args.prefill_delay is None
    assert dict(args.policy_flags) == {}


@pytest.mark.parametrize(("attempt", "any_"), [(1, 1), (4, 16), (8, 8)])
def test_complete_pair_gives_a_delay(attempt: int, any_: int) -> None:
    args = ServerArgs(prefill_attempt_interval=attempt, prefill_any_attempt_interval=any_)
    assert args.prefill_policy_name == "roundgate"
    assert args.policy_config == PrefillDelay(attempt, any_)
    assert dict(args.policy_flags) == {
        "prefill_attempt_interval": attempt,
        "prefill_any_attempt_interval": any_,
    }
    assert args.prefill_delay == PrefillDelay(attempt, any_)
    assert args.policy_config_as(VllmIntervalConfig) is None  # another policy's config


@pytest.mark.parametrize(
    ("attempt", "any_", "missing"),
    [(4, None, ANY), (None, 16, ATTEMPT), (1, None, ANY), (None, 1, ATTEMPT)],
)
def test_incomplete_pair_is_refused(attempt: int | None, any_: int | None, missing: str) -> None:
    with refuses(f"--prefill-policy roundgate needs {missing}"):
        ServerArgs(prefill_attempt_interval=attempt, prefill_any_attempt_interval=any_)


@pytest.mark.parametrize(("attempt", "any_"), [(4, 2), (16, 15), (2, 1)])
def test_any_below_attempt_is_refused(attempt: int, any_: int) -> None:
    with refuses(f"{ANY} ({any_}) must be >= {ATTEMPT} ({attempt})"):
        ServerArgs(prefill_attempt_interval=attempt, prefill_any_attempt_interval=any_)


# --- ``prefill_delay``: the design's property, computed from the current flags ----------------


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        ({}, None),  # both intervals unset: no gate
        (GATE, PrefillDelay(4, 16)),
        ({"prefill_attempt_interval": 1, "prefill_any_attempt_interval": 1}, PrefillDelay(1, 1)),
        ({"prefill_policy": "roundgate", **GATE}, PrefillDelay(4, 16)),
        ({"prefill_decode_interval": 3}, None),  # another policy
        ({"prefill_policy": "roundgate-auto"}, None),  # the adaptive gate has its own flags
        ({"prefill_policy": "sglang-delayer"}, None),
        ({"disaggregation_mode": "prefill"}, None),
        ({"disaggregation_mode": "decode"}, None),
        ({**GATE, "prefill_decode_interval": None}, PrefillDelay(4, 16)),  # None is unset
    ],
)
def test_prefill_delay(changes: dict[str, Any], expected: PrefillDelay | None) -> None:
    args = ServerArgs(**changes)
    assert args.prefill_delay == expected
    # A copy recomputes it from its own flags, whichever way it is made.
    assert ServerArgs().replace(**changes).prefill_delay == expected
    assert dataclasses.replace(ServerArgs(), **changes).prefill_delay == expected


@pytest.mark.parametrize("copy", [ServerArgs.replace, dataclasses.replace])
def test_prefill_delay_follows_a_copy(copy: Any) -> None:
    gated = ServerArgs(**GATE)
    assert copy(gated, prefill_attempt_interval=2).prefill_delay == PrefillDelay(2, 16)
    unset = {"prefill_attempt_interval": None, "prefill_any_attempt_interval": None}
    assert copy(gated, **unset).prefill_delay is None
    assert gated.prefill_delay == PrefillDelay(4, 16)  # the original is untouched


@pytest.mark.parametrize(
    ("changes", "flag"),
    [
        ({"prefill_attempt_interval": 4}, f"--prefill-policy roundgate needs {ANY}"),
        ({"prefill_any_attempt_interval": 16}, f"--prefill-policy roundgate needs {ATTEMPT}"),
        ({**GATE, "prefill_any_attempt_interval": None}, ANY),
        ({**GATE, "prefill_attempt_interval": None}, ATTEMPT),
        ({**GATE, "disaggregation_mode": "prefill"}, "--disaggregation-mode prefill"),
        ({**GATE, "disaggregation_mode": "decode"}, "--disaggregation-mode decode"),
        ({**GATE, "prefill_decode_interval": 2}, LOCAL_ONLY + " (selected: roundgate)"),
    ],
)
def test_prefill_delay_refusals(changes: dict[str, Any], flag: str) -> None:
    """An incomplete pair, or the gate where it cannot run, is refused wherever it is built:
    at construction, by ``ServerArgs.replace`` and by ``dataclasses.replace`` alike."""
    with refuses(flag):
        ServerArgs(**changes)
    with refuses(flag):
        ServerArgs().replace(**changes)
    with refuses(flag):
        dataclasses.replace(ServerArgs(), **changes)


@pytest.mark.parametrize("copy", [ServerArgs.replace, dataclasses.replace])
@pytest.mark.parametrize(
    ("changes", "flag"),
    [
        ({"prefill_attempt_interval": None}, ATTEMPT),
        ({"prefill_any_attempt_interval": None}, ANY),
        ({"disaggregation_mode": "decode"}, "--disaggregation-mode"),
        ({"prefill_decode_interval": 2}, LOCAL_ONLY),
    ],
)
def test_a_gated_copy_that_breaks_the_pair_is_refused(
    copy: Any, changes: dict[str, Any], flag: str
) -> None:
    with refuses(flag):
        copy(ServerArgs(**GATE), **changes)


# --- validation at construction -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("changes", "flag"),
    [
        # A prefill policy is for the fused role only.
        ({**GATE, "disaggregation_mode": "prefill"}, "--disaggregation-mode"),
        ({**GATE, "disaggregation_mode": "decode"}, "--disaggregation-mode"),
        ({"prefill_decode_interval": 2, "disaggregation_mode": "prefill"}, "--disaggregation-mode"),
        (
            {"prefill_policy": "vllm-interval", "disaggregation_mode": "decode"},
            "--disaggregation-mode",
        ),
        # The gate and the local interval policy exclude each other.
        ({**GATE, "prefill_decode_interval": 1}, LOCAL_ONLY + " (selected: roundgate)"),
        ({**GATE, "prefill_decode_interval": 8}, LOCAL_ONLY + " (selected: roundgate)"),
        # Unset is "no local policy"; 0 is no longer a way to say so.
        ({"prefill_decode_interval": 0}, "--prefill-decode-interval must be >= 1"),
        ({"prefill_decode_interval": -1}, "--prefill-decode-interval"),
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
        ({"max_model_len": CONTEXT + 1}, "--max-model-len"),
        ({"collective_timeout_s": 0.0}, "--collective-timeout-s"),
        ({"disaggregation_mode": "both"}, "--disaggregation-mode"),
        ({"device": "tpu"}, "--device"),
        ({"attention_backend": "xformers"}, "--attention-backend"),
        ({"moe_backend": "ep"}, "--moe-backend"),
        ({"model": "no-such-preset"}, "--model"),
    ],
)
def test_construction_refuses(changes: dict[str, Any], flag: str) -> None:
    with refuses(flag):
        ServerArgs(**changes)
    # The same refusal reaches a copy of a valid instance.
    with refuses(flag):
        ServerArgs().replace(**changes)


@pytest.mark.parametrize(
    "changes",
    [
        {**GATE, "disaggregation_mode": "null"},
        {"disaggregation_mode": "prefill"},
        {"disaggregation_mode": "decode", "prefill_policy": "none"},
        {"prefill_decode_interval": 4},
        {"prefill_decode_interval": 1},
        {**GATE, "prefill_decode_interval": None},  # None is unset, not a second policy
        {"dp_size": 4, "max_num_seqs": 4},
        {
            "max_model_len": CONTEXT,
            "collective_timeout_s": 0.5,
            "enable_mixed_prefill_decode": True,
        },
    ],
)
def test_construction_accepts(changes: dict[str, Any]) -> None:
    args = ServerArgs(**changes)
    assert ServerArgs(**args.to_dict()) == args


@pytest.mark.parametrize(
    ("changes", "flag"),
    [
        ({"prefill_decode_interval": "2"}, "--prefill-decode-interval must be an integer"),
        ({"prefill_decode_interval": 2.0}, "--prefill-decode-interval must be an integer"),
        ({"max_model_len": "4096"}, "--max-model-len"),
        ({"collective_timeout_s": "30"}, "--collective-timeout-s"),
    ],
)
def test_wrong_types_name_the_flag(changes: dict[str, Any], flag: str) -> None:
    with refuses(flag):
        ServerArgs(**changes)


def test_unknown_argument_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="dp_sise"):
        ServerArgs(dp_sise=2)


@pytest.mark.parametrize(
    ("given", "role"),
    [
        ("null", DisaggregationRole.FUSED),  # the flag's fused spelling before the enum
        (None, DisaggregationRole.FUSED),  # a YAML serve config's bare ``null``
        ("fused", DisaggregationRole.FUSED),
        (DisaggregationRole.FUSED, DisaggregationRole.FUSED),
        ("prefill", DisaggregationRole.PREFILL),
        ("decode", DisaggregationRole.DECODE),
    ],
)
def test_the_role_is_an_enum_whatever_its_spelling(given: Any, role: DisaggregationRole) -> None:
    args = ServerArgs(disaggregation_mode=given)
    assert args.disaggregation_mode is role
    assert parse_server_args(to_argv(args)) == args
    assert pickle.loads(pickle.dumps(args)).disaggregation_mode is role


@pytest.mark.parametrize(
    ("max_num_seqs", "dp_size", "expected"),
    [(64, 1, 64), (64, 4, 16), (7, 2, 3), (8, 8, 1), (100, 8, 12)],
)
def test_max_batch_size(max_num_seqs: int, dp_size: int, expected: int) -> None:
    args = ServerArgs(max_num_seqs=max_num_seqs, dp_size=dp_size)
    assert args.max_batch_size == expected


@pytest.mark.parametrize("changes", [{}, GATE, {"prefill_policy": "sglang-delayer"}])
def test_flat_dict_and_pickle_rebuild_an_equal_instance(changes: dict[str, Any]) -> None:
    args = ServerArgs(dp_size=2, max_num_seqs=8, max_model_len=1024, **changes)
    assert ServerArgs(**args.to_dict()) == args
    assert pickle.loads(pickle.dumps(args)) == args


# --- the context length: resolved once, from the flag or the model ----------------------------


@pytest.mark.parametrize("model", sorted(PRESETS))
def test_unset_max_model_len_resolves_to_the_model_limit(model: str) -> None:
    args = ServerArgs(model=model)
    assert args.max_model_len == PRESETS[model].max_position == CONTEXT
    assert args.to_dict()["max_model_len"] == CONTEXT


@pytest.mark.parametrize("flag", [1, 512, CONTEXT])
def test_max_model_len_at_or_below_the_limit_is_kept(flag: int) -> None:
    assert ServerArgs(max_model_len=flag).max_model_len == flag


@pytest.mark.parametrize("flag", [CONTEXT + 1, 8192, 1 << 17])
def test_max_model_len_above_the_limit_names_both_numbers(flag: int) -> None:
    with pytest.raises(ValueError) as info:
        ServerArgs(model="tiny-llama", max_model_len=flag)
    message = str(info.value)
    assert "--max-model-len" in message
    assert str(flag) in message and f"({CONTEXT})" in message, message


def test_a_model_directory_sets_its_own_limit(tmp_path: Path) -> None:
    config = with_overrides(PRESETS["tiny-llama"], max_position=8192)
    (tmp_path / "config.json").write_text(json.dumps(config.to_hf_dict()))
    assert ServerArgs(model=str(tmp_path)).max_model_len == 8192
    assert ServerArgs(model=str(tmp_path), max_model_len=8192).max_model_len == 8192
    with refuses("--max-model-len 8193 exceeds the model's max_position_embeddings (8192)"):
        ServerArgs(model=str(tmp_path), max_model_len=8193)
