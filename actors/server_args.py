"""Engine configuration: one frozen dataclass, validated once where it is built.

A ``ServerArgs`` that exists is valid: ``__init__`` validates, and nothing can change it
afterwards (``replace`` builds a new, validated copy). It is validated once, in the process
that builds it (``build_app``, a CLI, a test), and crosses process boundaries as itself:
unpickling restores the validated fields and what was derived from them (the model's config,
the policy's config) without validating or reading the model from disk again. The prefill
policy's flags are not fields: the policy registry declares them, and they live in
``policy_flags`` as given. Code reads them typed, through the selected policy's frozen config
(``policy_config``, ``policy_config_as``) or ``prefill_delay``.

The fields are the flag table: each one's metadata carries its help, its choices and whether
it must be a positive integer; the command line (``roundgate.cli.engine_flags``) and the
serve config's keys (``engine_arg_names``) are derived from it.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, TypeVar

from roundgate.actors import kv_budget
from roundgate.actors.control.speculative_config import (
    SpeculativeConfig,
    check_mtp,
    check_speculative,
)
from roundgate.actors.expert_flags import check_expert_flags
from roundgate.actors.model.config import ModelConfig, with_overrides
from roundgate.actors.model.draft_checks import check_draft, check_tokens
from roundgate.actors.model.resolve import resolve_model_config
from roundgate.actors.role import DISAGGREGATION_MODES, DisaggregationRole
from roundgate.gate import registry
from roundgate.gate.delay import PrefillDelay
from roundgate.gate.policy import PrefillPolicy
from roundgate.gate.spec import PolicyContext
from roundgate.kernels.attention import registry as attention_kernels
from roundgate.kernels.moe import registry as moe_kernels
from roundgate.kernels.triton_env import check_triton_device

# The closed sets of values some flags take (``_validate`` checks them, argparse lists them).
DEVICES = ("auto", "cpu", "cuda")
# The kernels' registries list their backends: adding one is a file and a registry line.
ATTENTION_BACKENDS = attention_kernels.names()
MOE_BACKENDS = moe_kernels.backend_names()
MOE_KERNELS = moe_kernels.kernel_names()
GGUF_WEIGHTS = ("packed", "int8-dot", "float")
FP8_WEIGHTS = ("auto", "keep", "dequantize")

C = TypeVar("C")


def _flag(
    help_text: str, default: Any, *, choices: tuple[str, ...] = (), positive: bool = False
) -> Any:
    """A dataclass field whose metadata carries its CLI help, its choices, whether it must be a
    positive integer."""
    return field(
        default=default, metadata={"help": help_text, "choices": choices, "positive": positive}
    )


@dataclass(frozen=True, init=False)
class ServerArgs:
    """Every engine flag; ``ServerArgs(**flat)`` accepts the policy flags as keywords too."""

    model: str = _flag(
        "a preset name (tiny-llama, tiny-moe, smollm2-135m-instruct), a local Hugging Face "
        "model directory, or a GGUF file (or a directory holding one)",
        "tiny-moe",
    )
    dp_size: int = _flag("attention data-parallel ranks in one group", 1, positive=True)
    max_num_seqs: int = _flag(
        "running requests across the group (split over dp ranks)", 64, positive=True
    )
    max_scheduled_tokens: int = _flag(
        "token budget of one round on one rank (chunked prefill)", 2048, positive=True
    )
    page_size: int = _flag("tokens per KV-cache page", 16, positive=True)
    num_kv_pages: int = _flag("KV-cache pages per rank", 1024, positive=True)
    kv_cache_memory_gb: float | None = _flag(
        "KV budget per rank, GiB (sets --num-kv-pages; needs --device cpu|cuda)", None
    )
    gpu_memory_utilization: float | None = _flag(
        "CUDA: share of GPU memory for weights + KV (the KV pool gets the rest)", None
    )
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
    # (RUF009 cannot tell that an enum member, like a str, is immutable.)
    disaggregation_mode: DisaggregationRole = _flag(  # noqa: RUF009
        "the rank's role: fused (also spelled null), prefill or decode",
        DisaggregationRole.FUSED,
        choices=DISAGGREGATION_MODES,
    )
    speculative_config: str | None = _flag(
        'speculative decoding, vLLM\'s JSON: {"method": "ngram", '
        '"num_speculative_tokens": k, "prompt_lookup_min": .., "prompt_lookup_max": ..} '
        "(docs/speculative.md); a serve config may give the object itself",
        None,
    )
    handoff_timeout_s: float = _flag(
        "prefill role: a handoff no decode rank has asked for after this many seconds is "
        "released, its pages unpinned (its ingress died or left it); a decode rank asking "
        "later fails that request. vLLM's VLLM_NIXL_ABORT_REQUEST_TIMEOUT, same default",
        480.0,
    )
    device: str = _flag("compute device", "auto", choices=DEVICES)
    attention_backend: str = _flag("paged attention backend", "auto", choices=ATTENTION_BACKENDS)
    moe_backend: str = _flag("MoE dispatch/combine backend", "auto", choices=MOE_BACKENDS)
    moe_kernel: str = _flag(
        "MoE expert computation: torch (a GEMM pair per expert) or triton (fused grouped "
        "GEMMs; CUDA, or CPU under TRITON_INTERPRET=1); auto is triton on CUDA, else torch "
        "(experts kept FP8 run the Triton FP8 kernel on CUDA whatever this says)",
        "auto",
        choices=MOE_KERNELS,
    )
    enable_eplb: bool = _flag(
        "expert-parallel load balancing (MoE, --dp-size > 1): count the tokens each expert "
        "gets and re-place experts over the ranks every --eplb-interval-rounds",
        False,
    )
    num_redundant_experts: int = _flag(
        "extra physical expert slots, for copies of the hottest experts (needs --enable-eplb "
        "or --expert-placement-file)",
        0,
    )
    eplb_window_rounds: int = _flag(
        "rounds of expert load a rebalance looks back over", 1000, positive=True
    )
    eplb_interval_rounds: int = _flag("rounds between two rebalances", 3000, positive=True)
    expert_placement_file: str | None = _flag(
        "a JSON file of each MoE layer's physical -> logical expert placement, computed offline "
        "(roundgate eplb-plan); the static placement, or EPLB's first",
        None,
    )
    eplb_load_file: str | None = _flag(
        "with --enable-eplb, rank 0 writes the group's expert loads (tokens per logical expert "
        "per MoE layer) here at each rebalance: the input of roundgate eplb-plan",
        None,
    )
    enforce_eager: bool = _flag(
        "run decode rounds eagerly (no CUDA graphs; they are captured per batch-size bucket on "
        "CUDA for dense models on --attention-backend triton)",
        False,
    )
    gguf_weights: str = _flag(
        "GGUF Q4_0/Q4_1/Q8_0 linear weights on CPU: packed (the file's blocks, an AVX2 kernel "
        "exact to the dequantized float32 weights), int8-dot (the same blocks, activations "
        "quantized to 8 bits per 32-block and integer dot products, as llama.cpp) or float "
        "(dequantized)",
        "packed",
        choices=GGUF_WEIGHTS,
    )
    fp8_weights: str = _flag(
        "block-scaled FP8 checkpoints (DeepSeek-V3's): keep (the projections and experts stay "
        "e4m3 with their 128x128 scales and run block-FP8 GEMMs; MLA's kv_b_proj is "
        "dequantized), dequantize (every weight to the runtime dtype at load) or auto (keep on "
        "CUDA with 128x128 blocks, else dequantize)",
        "auto",
        choices=FP8_WEIGHTS,
    )
    seed: int = _flag("seed for preset weights and sampling", 0)
    stream_interval: int = _flag("tokens batched per streamed chunk under load", 1, positive=True)
    collective_timeout_s: float = _flag("timeout of one group collective, seconds", 30.0)
    max_grammar_compile_s: float = _flag(
        "time limit of one structured-output grammar's compile, seconds (past it: a 400)", 10.0
    )
    max_grammar_cache: int = _flag("compiled grammars a rank keeps (LRU)", 256, positive=True)
    async_scheduling: bool = _flag(
        "plan each round while the previous round's forward runs (its tokens applied one round "
        "later); refused with speculative decoding, the P/D roles and an elastic MoE group, "
        "and per request for grammars and n > 1 (docs/architecture.md, overlapped rounds)",
        False,
    )
    log_gate_windows: bool = _flag(
        "log one JSON line per gate window (round, point, ranks that prefilled, tokens)", False
    )
    publish_kv_events: bool = _flag(
        "send the pool's stored/removed page keys and the rank's load to the KV-event hub "
        "(set by the deployment for the kv-aware and gate-aware routers)",
        False,
    )
    # The selected policy's flags as given, by flag name (``prefill_schedule_interval``...).
    policy_flags: Mapping[str, Any] = field(default_factory=dict, hash=False)
    # Derived once in ``__init__`` from the flags above: not flags, and not compared (their
    # inputs are). The selected policy (named, or implied by its flags), its frozen config
    # (e.g. ``PrefillDelay``), and the model's config (vocabulary, context, stop ids).
    prefill_policy_name: str = field(init=False, compare=False, repr=False)
    policy_config: object = field(init=False, compare=False, repr=False)
    model_config: ModelConfig = field(init=False, compare=False, repr=False)
    # ``speculative_config`` parsed (None: no speculation).
    speculative: SpeculativeConfig | None = field(init=False, compare=False, repr=False)

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
        for name in CORE_FIELDS:
            object.__setattr__(self, name, values.get(name, _DEFAULTS[name]))
        object.__setattr__(self, "policy_flags", MappingProxyType(given))
        self._validate()

    @classmethod
    def of(cls, value: ServerArgs | Mapping[str, Any]) -> ServerArgs:
        """``value`` itself when it is a ``ServerArgs`` (already valid), else one built (and
        validated) from a flat dict such as a serve config's engine keys."""
        return value if isinstance(value, ServerArgs) else cls(**value)

    def __getstate__(self) -> dict[str, Any]:
        """Every field, the derived ones included (the read-only ``policy_flags`` view as a
        plain dict): what ``__setstate__`` needs to restore it without validating."""
        state = dict(self.__dict__)
        state["policy_flags"] = dict(self.policy_flags)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        """Unpickled as it was pickled: valid already, so neither validated again nor the
        model's config read again from disk in the receiving process."""
        for name, value in state.items():
            object.__setattr__(self, name, value)
        object.__setattr__(self, "policy_flags", MappingProxyType(dict(state["policy_flags"])))

    # ---- validation (once per construction) ---------------------------------------------

    def _validate(self) -> None:
        """Raise ``ValueError`` naming the flag for any refused setting."""
        for name in _POSITIVE:
            value = getattr(self, name)
            if not _is_int(value) or value < 1:
                raise ValueError(f"{flag_name(name)} must be a positive integer, got {value!r}")
        for flag, value in (
            ("--collective-timeout-s", self.collective_timeout_s),
            ("--max-grammar-compile-s", self.max_grammar_compile_s),
            ("--handoff-timeout-s", self.handoff_timeout_s),
        ):
            if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
                raise ValueError(f"{flag} must be a number > 0, got {value!r}")
        # The role as its enum: ``null`` and ``fused`` name the same role.
        role = DisaggregationRole.parse(self.disaggregation_mode)
        object.__setattr__(self, "disaggregation_mode", role)
        for name, choices in _CHOICES.items():
            value = getattr(self, name)
            if value not in choices:
                raise ValueError(
                    f"{flag_name(name)} must be one of {', '.join(choices)}, got {value!r}"
                )
        if self.device == "cpu":  # auto may still find CUDA on the rank: the runner checks
            if self.attention_backend == "triton":
                check_triton_device("--attention-backend", "cpu")
            if self.moe_kernel == "triton":
                check_triton_device("--moe-kernel", "cpu")
        if self.max_num_seqs < self.dp_size:
            raise ValueError(
                f"--max-num-seqs ({self.max_num_seqs}) must be >= --dp-size ({self.dp_size}): "
                "every rank needs at least one batch slot"
            )
        self._validate_policy()
        object.__setattr__(self, "max_model_len", self._context_length())
        self._check_fp8_weights()
        check_expert_flags(self)
        speculative = check_speculative(self.speculative_config, self.disaggregation_mode)
        object.__setattr__(self, "speculative", speculative)
        if speculative is not None and speculative.method == "mtp":  # its layer's K/V cached
            model = self.model_config
            layers = check_mtp(
                speculative,
                model.num_nextn_predict_layers,
                model.architecture,
                self.disaggregation_mode,
            )
            object.__setattr__(self, "model_config", with_overrides(model, draft_layers=layers))
        if speculative is not None and speculative.method == "draft_model":
            self._check_draft(speculative.model or "")
        if self.async_scheduling:
            self._check_async_scheduling()
        if isinstance(self.speculative_config, Mapping):  # a serve config's object, as text
            object.__setattr__(self, "speculative_config", json.dumps(self.speculative_config))
        self._size_kv_pool()
        if self.chat_template is not None and not Path(self.chat_template).is_file():
            raise ValueError(f"--chat-template {self.chat_template}: no such file")

    def _check_async_scheduling(self) -> None:
        """``--async-scheduling`` plans round N+1 before round N's tokens are known and runs
        the forward beside the next gather: refused where either cannot hold."""
        why = None
        if self.speculative is not None:
            why = "--speculative-config drafts round N+1 from round N's tokens"
        elif self.disaggregation_mode is not DisaggregationRole.FUSED:
            why = (
                f"--disaggregation-mode {self.disaggregation_mode} moves requests between "
                "ranks at their tokens"
            )
        if why is not None:
            raise ValueError(f"--async-scheduling is not supported here: {why}")

    def _check_fp8_weights(self) -> None:
        """``--fp8-weights keep`` needs a block-FP8 checkpoint with the kernels' 128x128
        blocks (``auto`` and ``dequantize`` take any model)."""
        if self.fp8_weights != "keep":
            return
        block = self.model_config.weight_block_size
        if block is None:
            raise ValueError(
                f"--fp8-weights keep: {self.model} is not a block-scaled FP8 checkpoint "
                "(config.json has no quantization_config weight_block_size)"
            )
        if tuple(block) != (128, 128):
            raise ValueError(
                f"--fp8-weights keep: {self.model} has {block[0]}x{block[1]} blocks; the FP8 "
                "kernels take 128x128 (use auto or dequantize)"
            )

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
        if name != "none" and self.disaggregation_mode is not DisaggregationRole.FUSED:
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

    def _check_draft(self, draft: str) -> None:
        """A draft model refused before any rank loads it (errors name
        ``speculative_config.model``): unreadable, another vocabulary or token list, MoE or
        latent attention, larger than the target."""
        try:
            config = resolve_model_config(draft)
        except (ValueError, OSError) as exc:
            raise ValueError(
                f"speculative_config.model {draft!r}: cannot be read ({exc})"
            ) from None
        check_draft(draft, config, self.model_config)
        check_tokens(draft, self.model)

    def _size_kv_pool(self) -> None:
        """``--kv-cache-memory-gb`` sets ``num_kv_pages`` (read by scheduler and runner)."""
        pages = kv_budget.pages_from_flags(self)
        if pages is not None:
            object.__setattr__(self, "num_kv_pages", pages)

    # ---- derived ------------------------------------------------------------------------

    @property
    def max_batch_size(self) -> int:
        """Running requests one rank may hold: ``max_num_seqs // dp_size``."""
        return self.max_num_seqs // self.dp_size

    @property
    def prefill_delay(self) -> PrefillDelay | None:
        """The group gate's two intervals: ``None`` when both are unset.

        Never half a pair: construction (and so ``replace``) refuses one interval without the
        other, and either with another policy's flag or a disaggregated role, so the intervals
        are set exactly when the gate is the selected policy and this is its config.
        """
        return self.policy_config_as(PrefillDelay)

    def policy_config_as(self, kind: type[C]) -> C | None:
        """The selected policy's config if it is a ``kind`` (``LocalIntervalConfig``...), else
        ``None``: a policy's flags read typed, without a branch on the policy's name."""
        config = self.policy_config
        return config if isinstance(config, kind) else None

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


def flag_fields() -> tuple[dataclasses.Field[Any], ...]:
    """The flag table: the fields that are flags (neither ``policy_flags`` nor a derived
    field), each with ``help``, ``choices`` and ``positive`` in its metadata."""
    return tuple(f for f in dataclasses.fields(ServerArgs) if f.init and f.name != "policy_flags")


CORE_FIELDS = tuple(f.name for f in flag_fields())
_DEFAULTS = {f.name: f.default for f in flag_fields()}
_CHOICES = {f.name: f.metadata["choices"] for f in flag_fields() if f.metadata["choices"]}
_POSITIVE = tuple(f.name for f in flag_fields() if f.metadata["positive"])


def engine_arg_names() -> tuple[str, ...]:
    """Every key a serve config may give the engine: fields, then policy flags."""
    return (*CORE_FIELDS, *registry.all_flags())


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def flag_name(name: str) -> str:
    """A field's command-line spelling: ``dp_size`` -> ``--dp-size``."""
    return "--" + name.replace("_", "-")
