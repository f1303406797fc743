"""Engine configuration: one dataclass, validated with errors that name the flag."""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from actors.policy_args import resolved_policy, validate_policy_args
from gate import PrefillDelay
from gate.policy import POLICIES

DISAGGREGATION_MODES = ("null", "prefill", "decode")
DEVICES = ("auto", "cpu", "cuda")
ATTENTION_BACKENDS = ("auto", "torch", "triton", "flashinfer")
MOE_BACKENDS = ("auto", "local", "torch", "deepep")


def _flag(help_text: str, **kwargs: Any) -> Any:
    """A dataclass field whose metadata carries its CLI help."""
    default = kwargs.pop("default")
    return field(default=default, metadata={"help": help_text, **kwargs})


@dataclass
class ServerArgs:
    """Every engine flag. Mutable on purpose: validation is re-run after programmatic edits."""

    model: str = _flag(
        "preset name (tiny-llama, tiny-moe) or a local HF model directory", default="tiny-moe"
    )
    dp_size: int = _flag("attention data-parallel ranks in one group", default=1)
    max_num_seqs: int = _flag("running requests across the group (split over dp ranks)", default=64)
    max_scheduled_tokens: int = _flag(
        "token budget of one round on one rank (chunked prefill)", default=2048
    )
    page_size: int = _flag("tokens per KV-cache page", default=16)
    num_kv_pages: int = _flag("KV-cache pages per rank", default=1024)
    max_model_len: int | None = _flag("context length cap; unset = the model's", default=None)
    prefill_attempt_interval: int | None = _flag(
        "group gate: rounds between ALL attempt points (set together with the ANY interval)",
        default=None,
    )
    prefill_any_attempt_interval: int | None = _flag(
        "group gate: rounds between ANY attempt points, the admission latency bound", default=None
    )
    prefill_decode_interval: int = _flag(
        "local policy: after a prefill round, hold new prefill for this many rounds (0 = off)",
        default=0,
    )
    prefill_policy: str | None = _flag(
        "prefill policy; unset = roundgate if the gate intervals are set, local-interval if "
        "--prefill-decode-interval > 0, else none",
        default=None,
        choices=POLICIES,
    )
    prefill_delayer_max_delay_passes: int | None = _flag(
        "sglang-delayer: forward passes a prefill may be delayed (unset = 30)", default=None
    )
    prefill_delayer_token_usage_low_watermark: float | None = _flag(
        "sglang-delayer: allow at once if a prefillable rank's KV usage is below this (0..1)",
        default=None,
    )
    prefill_delayer_queue_min_ratio: float | None = _flag(
        "sglang-delayer: also delay while the queue is below running x this ratio (opt-in)",
        default=None,
    )
    prefill_delayer_max_delay_ms: float | None = _flag(
        "sglang-delayer: the queue condition gives up after this long (unset = 5000)",
        default=None,
    )
    prefill_delayer_prefill_max_requests: int | None = _flag(
        "sglang-delayer: cap of the queue threshold (unset = the max prefill batch seen)",
        default=None,
    )
    prefill_schedule_interval: int | None = _flag(
        "vllm-interval: admit fresh prefill on every N-th step only (unset = 1, off)",
        default=None,
    )
    attention_dp_timeout_iters: int | None = _flag(
        "trtllm-balance: rounds context requests may wait for every rank (unset = 50)",
        default=None,
    )
    attention_dp_batching_wait_iters: int | None = _flag(
        "trtllm-balance: rounds to gather context when all ranks have some (unset = 10)",
        default=None,
    )
    enable_mixed_prefill_decode: bool = _flag(
        "run decodes and prefill chunks in one batch", default=False
    )
    disaggregation_mode: str = _flag(
        "fused (null), prefill or decode role", default="null", choices=DISAGGREGATION_MODES
    )
    device: str = _flag("compute device", default="auto", choices=DEVICES)
    attention_backend: str = _flag(
        "paged attention backend", default="auto", choices=ATTENTION_BACKENDS
    )
    moe_backend: str = _flag("MoE dispatch/combine backend", default="auto", choices=MOE_BACKENDS)
    seed: int = _flag("seed for preset weights and sampling", default=0)
    stream_interval: int = _flag("tokens batched per streamed chunk under load", default=1)
    collective_timeout_s: float = _flag("timeout of one group collective, seconds", default=30.0)
    log_gate_windows: bool = _flag(
        "log one JSON line per gate window (round, point, ranks that prefilled, tokens)",
        default=False,
    )

    @property
    def prefill_delay(self) -> PrefillDelay | None:
        """The group gate's intervals, recomputed from the current fields on every access."""
        attempt, any_ = self.prefill_attempt_interval, self.prefill_any_attempt_interval
        if attempt is None and any_ is None:
            return None
        if attempt is None or any_ is None:
            missing = (
                "--prefill-attempt-interval"
                if attempt is None
                else ("--prefill-any-attempt-interval")
            )
            raise ValueError(
                f"the group gate needs both intervals: {missing} is unset "
                "(set --prefill-attempt-interval and --prefill-any-attempt-interval together)"
            )
        return PrefillDelay(attempt, any_)

    @property
    def prefill_policy_name(self) -> str:
        """The policy that runs: ``prefill_policy``, or the one the older flags imply."""
        return resolved_policy(self)

    @property
    def max_batch_size(self) -> int:
        """Running requests one rank may hold: ``max_num_seqs // dp_size``."""
        return self.max_num_seqs // self.dp_size

    def validate(self) -> ServerArgs:
        """Raise ``ValueError`` naming the flag for any refused setting; return self."""
        positive = (
            "dp_size",
            "max_num_seqs",
            "max_scheduled_tokens",
            "page_size",
            "num_kv_pages",
            "stream_interval",
        )
        for name in positive:
            value = getattr(self, name)
            if not _is_int(value) or value < 1:
                raise ValueError(f"{_cli(name)} must be a positive integer, got {value!r}")
        if self.max_model_len is not None and (
            not _is_int(self.max_model_len) or self.max_model_len < 1
        ):
            raise ValueError(
                f"--max-model-len must be a positive integer, got {self.max_model_len!r}"
            )
        if not _is_int(self.prefill_decode_interval) or self.prefill_decode_interval < 0:
            raise ValueError(
                f"--prefill-decode-interval must be an integer >= 0, got "
                f"{self.prefill_decode_interval!r}"
            )
        timeout = self.collective_timeout_s
        if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not timeout > 0:
            raise ValueError(f"--collective-timeout-s must be a number > 0, got {timeout!r}")
        for name, choices in (
            ("disaggregation_mode", DISAGGREGATION_MODES),
            ("device", DEVICES),
            ("attention_backend", ATTENTION_BACKENDS),
            ("moe_backend", MOE_BACKENDS),
        ):
            if getattr(self, name) not in choices:
                raise ValueError(
                    f"{_cli(name)} must be one of {', '.join(choices)}, got {getattr(self, name)!r}"
                )
        delay = self.prefill_delay
        if delay is not None and self.disaggregation_mode != "null":
            raise ValueError(
                "--prefill-attempt-interval/--prefill-any-attempt-interval apply to the fused "
                f"role only; --disaggregation-mode {self.disaggregation_mode} ignores the gate"
            )
        if delay is not None and self.prefill_decode_interval > 0:
            raise ValueError(
                "--prefill-decode-interval cannot be combined with the group gate "
                "(--prefill-attempt-interval/--prefill-any-attempt-interval): a local hold "
                "would break the group's aligned prefill windows"
            )
        if self.max_num_seqs < self.dp_size:
            raise ValueError(
                f"--max-num-seqs ({self.max_num_seqs}) must be >= --dp-size ({self.dp_size}): "
                "every rank needs at least one batch slot"
            )
        validate_policy_args(self)
        return self

    def replace(self, **changes: Any) -> ServerArgs:
        """A validated copy with ``changes`` applied."""
        return dataclasses.replace(self, **changes).validate()

    @classmethod
    def add_cli_args(cls, parser: argparse.ArgumentParser) -> None:
        """Add one ``--flag`` per field, with its default in the help."""
        for f in dataclasses.fields(cls):
            flag = _cli(f.name)
            help_text = f.metadata["help"]  # ArgumentDefaultsHelpFormatter adds the default
            if f.type in ("bool", bool):
                parser.add_argument(
                    flag, action=argparse.BooleanOptionalAction, default=f.default, help=help_text
                )
                continue
            kind = _scalar_type(f.type)
            parser.add_argument(
                flag,
                type=kind,
                default=f.default,
                choices=f.metadata.get("choices"),
                help=help_text,
            )

    @classmethod
    def from_namespace(cls, ns: argparse.Namespace) -> ServerArgs:
        """Build from parsed CLI args; refusals become argparse-style errors upstream."""
        values = {f.name: getattr(ns, f.name) for f in dataclasses.fields(cls)}
        return cls(**values).validate()

    @classmethod
    def from_cli(cls, argv: Sequence[str] | None = None) -> ServerArgs:
        """Parse ``argv``; an invalid value exits with an argparse error naming the flag."""
        parser = argparse.ArgumentParser(
            prog="roundgate",
            description="roundgate engine arguments",
            formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        )
        cls.add_cli_args(parser)
        ns = parser.parse_args(argv)
        try:
            return cls.from_namespace(ns)
        except ValueError as exc:
            parser.error(str(exc))
            raise  # unreachable: parser.error exits

    def to_cli(self) -> list[str]:
        """The argv that ``from_cli`` turns back into an equal ServerArgs."""
        argv: list[str] = []
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value is None:
                continue
            if isinstance(value, bool):
                argv.append(_cli(f.name) if value else "--no-" + _cli(f.name)[2:])
            else:
                argv += [_cli(f.name), str(value)]
        return argv


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _cli(name: str) -> str:
    return "--" + name.replace("_", "-")


def _scalar_type(annotation: Any) -> type:
    text = str(annotation)
    if "int" in text:
        return int
    if "float" in text:
        return float
    return str
