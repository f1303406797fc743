"""``speculative_config``: which drafts a rank verifies, in vLLM's shape.

The same JSON vLLM's ``--speculative-config`` takes, so a deployment moves between the two
unchanged: ``{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 2,
"prompt_lookup_max": 5}``, ``{"method": "mtp", "num_speculative_tokens": 1}`` or
``{"method": "draft_model", "model": "<path>", "num_speculative_tokens": 4}``. ``k``
(``num_speculative_tokens``) is group-wide: under attention DP every rank runs the same
forwards each round, so a rank cannot verify more drafts than its peers.

Each refusal names the field. Defaults as vLLM's: n-gram lookup 5..5 when neither bound is
given, the other bound equal to the one given.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from roundgate.actors.role import DisaggregationRole

METHODS = ("ngram", "mtp", "draft_model")
# More drafts than this buys nothing measurable (acceptance decays geometrically) and makes
# the verify forward a long extend; vLLM's examples stay well under it too.
MAX_SPECULATIVE_TOKENS = 16
MAX_LOOKUP = 64
_DEFAULT_LOOKUP = 5
_FIELDS = {
    "method",
    "num_speculative_tokens",
    "prompt_lookup_min",
    "prompt_lookup_max",
    "model",
}


@dataclass(frozen=True, slots=True, kw_only=True)
class SpeculativeConfig:
    """A validated ``speculative_config``."""

    method: str
    num_speculative_tokens: int
    prompt_lookup_min: int = 0  # ngram only
    prompt_lookup_max: int = 0  # ngram only
    model: str | None = None  # draft_model only

    @property
    def k(self) -> int:
        return self.num_speculative_tokens


def _positive_int(value: Any, name: str, limit: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= limit:
        raise ValueError(
            f"speculative_config.{name} must be an integer in 1..{limit}, got {value!r}"
        )
    return value


def parse_speculative_config(value: Mapping[str, Any]) -> SpeculativeConfig:
    """``value`` checked field by field; a ``ValueError`` naming the first bad one."""
    if not isinstance(value, Mapping):
        raise ValueError(f"speculative_config must be a JSON object, got {type(value).__name__}")
    unknown = sorted(set(value) - _FIELDS)
    if unknown:
        raise ValueError(
            f"speculative_config: unknown field(s) {unknown} (known: {sorted(_FIELDS)})"
        )
    method = value.get("method")
    if method not in METHODS:
        raise ValueError(
            f"speculative_config.method must be one of {list(METHODS)}, got {method!r}"
        )
    if "num_speculative_tokens" not in value:
        raise ValueError("speculative_config.num_speculative_tokens is required")
    k = _positive_int(
        value["num_speculative_tokens"], "num_speculative_tokens", MAX_SPECULATIVE_TOKENS
    )
    lookup = {n: value.get(n) for n in ("prompt_lookup_min", "prompt_lookup_max")}
    model = value.get("model")
    if method != "ngram":
        given = sorted(n for n, v in lookup.items() if v is not None)
        if given:
            raise ValueError(f"speculative_config.{given[0]} applies to method ngram only")
    if method != "draft_model" and model is not None:
        raise ValueError(
            f"speculative_config.model applies to method draft_model only (method {method} "
            "drafts from the request itself)"
            if method == "ngram"
            else "speculative_config.model applies to method draft_model only (mtp uses the "
            "checkpoint's own next-n layer)"
        )
    if method == "draft_model" and not (isinstance(model, str) and model):
        raise ValueError(
            "speculative_config.model (the draft model) is required by method draft_model"
        )
    if method != "ngram":
        return SpeculativeConfig(method=method, num_speculative_tokens=k, model=model)
    given = {n: _positive_int(v, n, MAX_LOOKUP) for n, v in lookup.items() if v is not None}
    low = given.get("prompt_lookup_min", given.get("prompt_lookup_max", _DEFAULT_LOOKUP))
    high = given.get("prompt_lookup_max", low)
    if low > high:
        raise ValueError(
            f"speculative_config.prompt_lookup_min ({low}) must not exceed "
            f"prompt_lookup_max ({high})"
        )
    return SpeculativeConfig(
        method=method, num_speculative_tokens=k, prompt_lookup_min=low, prompt_lookup_max=high
    )


# Parsed and checked, but no rank can run them yet: refused by name rather than ignored.
NOT_BUILT: dict[str, str] = {}


def check_mtp(
    config: SpeculativeConfig, nextn_layers: int, architecture: str, role: DisaggregationRole
) -> int:
    """The next-n layers an ``mtp`` deployment runs (its ``ModelConfig.draft_layers``), or a
    ``ValueError`` naming the field: a checkpoint without a next-n layer, more drafts than
    one a round (``roundgate.actors.model.mtp``: the layer drafts once per round), and a
    decode rank of a P/D pair (the prompt's K/V it receives has no next-n layer)."""
    if nextn_layers < 1:
        raise ValueError(
            f"--speculative-config: method mtp needs a checkpoint with a next-n (MTP) layer; "
            f"{architecture} has num_nextn_predict_layers 0 (method ngram runs on any model)"
        )
    if config.k > 1:
        raise ValueError(
            f"speculative_config.num_speculative_tokens must be 1 for method mtp (got "
            f"{config.k}): the next-n layer drafts one token a round"
        )
    if role is DisaggregationRole.DECODE:
        raise ValueError(
            "--speculative-config method mtp: a decode rank (--disaggregation-mode decode) "
            "receives prompts' K/V without the next-n layer's; use method ngram there"
        )
    return 1


def check_speculative(
    value: str | Mapping[str, Any] | None, role: DisaggregationRole
) -> SpeculativeConfig | None:
    """``--speculative-config`` (JSON text, or the object from a serve config) as a
    ``SpeculativeConfig``; None when unset. Refused, naming the flag: bad JSON, a bad field,
    a method not built yet, and a prefill rank (it never decodes: its decode ranks
    speculate)."""
    if value is None:
        return None
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise ValueError(f"--speculative-config is not JSON: {exc.msg}") from None
    try:
        config = parse_speculative_config(value)
    except ValueError as exc:
        raise ValueError(f"--speculative-config: {exc}") from None
    if config.method in NOT_BUILT:
        raise ValueError(
            f"--speculative-config: method {config.method}: {NOT_BUILT[config.method]} "
            "(method ngram runs on any model)"
        )
    if role is DisaggregationRole.PREFILL:
        raise ValueError(
            "--speculative-config applies to fused and decode ranks; a prefill rank "
            "(--disaggregation-mode prefill) never decodes"
        )
    return config
