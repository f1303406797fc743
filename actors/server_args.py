"""Engine configuration: one frozen dataclass, validated once where it is built.

A ``ServerArgs`` that exists is valid: ``__init__`` validates, and nothing can change it
afterwards (``replace`` builds a new, validated copy). Each process builds it once from the
flat dict ``to_dict`` sends (``build_app``, the ingress, every rank), so each process boundary
validates exactly once. The prefill policy's flags are not fields: the policy registry
declares them, and they live in ``policy_flags`` (read back as attributes, ``None`` if unset).
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from actors.model.resolve import resolve_model_config
from gate import registry
from gate.policy import PrefillPolicy
from gate.spec import PolicyContext, annotation_type

DISAGGREGATION_MODES = ("null", "prefill", "decode")
DEVICES = ("auto", "cpu", "cuda")
ATTENTION_BACKENDS = ("auto", "torch", "triton", "flashinfer")
MOE_BACKENDS = ("auto", "local", "torch", "deepep")
POSITIVE = ("dp_size", "max_num_seqs", "max_scheduled_tokens", "page_size", "num_kv_pages")
CHOICES = {
    "disaggregation_mode": DISAGGREGATION_MODES,
    "device": DEVICES,
    "attention_backend": ATTENTION_BACKENDS,
    "moe_backend": MOE_BACKENDS,
    "gguf_weights": ("packed", "float"),
}


def _flag(help_text: str, default: Any) -> Any:
    """A dataclass field whose metadata carries its CLI help."""
    return field(default=default, metadata={"help": help_text})


@dataclass(frozen=True, init=False)
class ServerArgs:
    """Every engine flag; ``ServerArgs(**flat)`` accepts the policy flags as keywords too."""

    model: str = _flag(
        "preset name (tiny-llama, tiny-moe) or a local HF model directory", "tiny-moe"
    )
    dp_size: int = _flag("attention data-parallel ranks in one group", 1)
    max_num_seqs: int = _flag("running requests across the group (split over dp ranks)", 64)
    max_scheduled_tokens: int = _flag(
        "token budget of one round on one rank (chunked prefill)", 2048
    )
    page_size: int = _flag("tokens per KV-cache page", 16)
    num_kv_pages: int = _flag("KV-cache pages per rank", 1024)
    chat_template: str | None = _flag(
        "a Jinja chat template file to use instead of the model's own", None
    )
    max_model_len: int | None = _flag(
        "context length; unset = the model's max_position_embeddings (resolved once, at start)",
        None,
    )
    prefill_policy: str | None = _flag(
        "prefill policy; unset = the one whose required flags are given (roundgate for the gate "
        "intervals, local-interval for --prefill-decode-interval), else none",
        None,
    )
    enable_mixed_prefill_decode: bool = _flag("run decodes and prefill chunks in one batch", False)
    enable_prefix_caching: bool = _flag(
        "reuse the cached KV pages of a prompt's longest computed prefix (off: every prompt "
        "prefills in full, for comparisons)",
        True,
    )
    disaggregation_mode: str = _flag("fused (null), prefill or decode role", "null")
    device: str = _flag("compute device", "auto")
    attention_backend: str = _flag("paged attention backend", "auto")
    moe_backend: str = _flag("MoE dispatch/combine backend", "auto")
    gguf_weights: str = _flag(
        "GGUF Q4_1/Q8_0 linear weights on CPU: packed (kept in the file's blocks, multiplied "
        "by an AVX2 kernel; a third of float32's bytes) or float (dequantized to float32)",
        "packed",
    )
    seed: int = _flag("seed for preset weights and sampling", 0)
    stream_interval: int = _flag("tokens batched per streamed chunk under load", 1)
    collective_timeout_s: float = _flag("timeout of one group collective, seconds", 30.0)
    log_gate_windows: bool = _flag(
        "log one JSON line per gate window (round, point, ranks that prefilled, tokens)", False
    )
    # The selected policy's flags as given, by flag name (``prefill_schedule_interval``...).
    policy_flags: Mapping[str, Any] = field(default_factory=dict, hash=False)

    def __init__(self, **values: Any) -> None:
        given = dict(values.pop("policy_flags", None) or {})
        policy_flags = registry.all_flags()
        for name in list(values):
            if name in policy_flags:
                value = values.pop(name)
                if value is None:
                    given.pop(name, None)
                else:
                    given[name] = value
        unknown = sorted(set(values) - set(CORE_FIELDS))
        if unknown:
            raise TypeError(f"unknown engine argument(s) {unknown}")
        for f in dataclasses.fields(self):
            if f.name != "policy_flags":
                object.__setattr__(self, f.name, values.get(f.name, f.default))
        object.__setattr__(self, "policy_flags", MappingProxyType(given))
        self._validate()

    def __getattr__(self, name: str) -> Any:
        """A policy flag by name (``None`` when not given)."""
        if name.startswith("_") or name == "policy_flags":
            raise AttributeError(name)
        if name in registry.all_flags():
            return self.policy_flags.get(name)
        raise AttributeError(f"ServerArgs has no field {name!r}")

    def __reduce__(self) -> tuple[Any, tuple[dict[str, Any]]]:
        """Pickled as its flat dict: the receiving process rebuilds (and validates) it."""
        return _rebuild, (self.to_dict(),)

    # ---- validation (once per construction) ---------------------------------------------

    def _validate(self) -> None:
        """Raise ``ValueError`` naming the flag for any refused setting."""
        for name in (*POSITIVE, "stream_interval"):
            value = getattr(self, name)
            if not _is_int(value) or value < 1:
                raise ValueError(f"{_cli(name)} must be a positive integer, got {value!r}")
        timeout = self.collective_timeout_s
        if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not timeout > 0:
            raise ValueError(f"--collective-timeout-s must be a number > 0, got {timeout!r}")
        for name, choices in CHOICES.items():
            if getattr(self, name) not in choices:
                raise ValueError(
                    f"{_cli(name)} must be one of {', '.join(choices)}, got {getattr(self, name)!r}"
                )
        if self.max_num_seqs < self.dp_size:
            raise ValueError(
                f"--max-num-seqs ({self.max_num_seqs}) must be >= --dp-size ({self.dp_size}): "
                "every rank needs at least one batch slot"
            )
        self._validate_policy()
        object.__setattr__(self, "max_model_len", self._context_length())
        if self.chat_template is not None and not Path(self.chat_template).is_file():
            raise ValueError(f"--chat-template {self.chat_template}: no such file")

    def _validate_policy(self) -> None:
        given = self.policy_flags
        name = self.prefill_policy
        if name is None:
            name = registry.implied_policy(given)
        spec = registry.get(name)
        for flag_name in given:
            flag, owner = registry.all_flags()[flag_name]
            if owner != name:
                raise ValueError(
                    f"{flag.cli} applies to --prefill-policy {owner} only (selected: {name})"
                )
        if name != "none" and self.disaggregation_mode != "null":
            raise ValueError(
                f"--prefill-policy {name} applies to the fused role only; --disaggregation-mode "
                f"{self.disaggregation_mode} runs no prefill gate"
            )
        # The config refuses bad values naming the flag; built once, reused by every rank.
        object.__setattr__(self, "policy_config", spec.make_config(given))
        object.__setattr__(self, "prefill_policy_name", name)

    def _context_length(self) -> int:
        """The flag, or the model's limit when unset; a flag above the model's is refused.

        Reads the model's config once (kept as ``model_config``: vocabulary, stop ids).
        """
        config = resolve_model_config(self.model)
        object.__setattr__(self, "model_config", config)
        limit = config.max_position
        flag = self.max_model_len
        if flag is None:
            return limit
        if not _is_int(flag) or flag < 1:
            raise ValueError(f"--max-model-len must be a positive integer, got {flag!r}")
        if flag > limit:
            raise ValueError(
                f"--max-model-len {flag} exceeds the model's max_position_embeddings ({limit})"
            )
        return flag

    # ---- derived ------------------------------------------------------------------------

    @property
    def max_batch_size(self) -> int:
        """Running requests one rank may hold: ``max_num_seqs // dp_size``."""
        return self.max_num_seqs // self.dp_size

    def build_policy(self, rank: int) -> PrefillPolicy:
        """The selected prefill policy, for one rank of the group."""
        spec = registry.get(self.prefill_policy_name)
        return spec.build(
            self.policy_config, PolicyContext(rank, self.dp_size, self.max_batch_size)
        )

    def replace(self, **changes: Any) -> ServerArgs:
        """A validated copy with ``changes`` applied (policy flags included; None unsets)."""
        return ServerArgs(**(self.to_dict() | changes))

    def to_dict(self) -> dict[str, Any]:
        """The flat form (serve config keys): fields, then the given policy flags."""
        values = {name: getattr(self, name) for name in CORE_FIELDS}
        return values | dict(self.policy_flags)

    # ---- the command line ---------------------------------------------------------------

    @classmethod
    def add_cli_args(cls, parser: argparse.ArgumentParser) -> None:
        """One ``--flag`` per field and per registered policy flag."""
        for f in dataclasses.fields(cls):
            if f.name == "policy_flags":
                continue
            flag, help_text = _cli(f.name), f.metadata["help"]
            if f.type in ("bool", bool):
                parser.add_argument(
                    flag, action=argparse.BooleanOptionalAction, default=f.default, help=help_text
                )
                continue
            choices = registry.names() if f.name == "prefill_policy" else CHOICES.get(f.name)
            parser.add_argument(
                flag,
                type=annotation_type(f.type),
                default=f.default,
                choices=choices,
                help=help_text,
            )
        for flag, owner in registry.all_flags().values():
            default = "required" if flag.required else f"default {flag.default}"
            parser.add_argument(
                flag.cli,
                type=flag.kind,
                default=None,
                help=f"{flag.help} (--prefill-policy {owner}; {default})",
            )

    @classmethod
    def from_namespace(cls, ns: argparse.Namespace) -> ServerArgs:
        """Build from parsed CLI args (unset policy flags stay unset)."""
        names = (*CORE_FIELDS, *registry.all_flags())
        return cls(**{name: getattr(ns, name) for name in names if hasattr(ns, name)})

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
        for name, value in self.to_dict().items():
            if value is None:
                continue
            if isinstance(value, bool):
                argv.append(_cli(name) if value else "--no-" + _cli(name)[2:])
            else:
                argv += [_cli(name), str(value)]
        return argv


CORE_FIELDS = tuple(f.name for f in dataclasses.fields(ServerArgs) if f.name != "policy_flags")


def _rebuild(values: dict[str, Any]) -> ServerArgs:
    return ServerArgs(**values)


def engine_arg_names() -> tuple[str, ...]:
    """Every key a serve config may give the engine: fields, then policy flags."""
    return (*CORE_FIELDS, *registry.all_flags())


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _cli(name: str) -> str:
    return "--" + name.replace("_", "-")
