"""Round costs for the group simulator: what one rank's forward and one group round cost.

Where each preset number comes from: docs/cost-model.md ("Calibrated presets").
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, fields


@dataclass(frozen=True)
class RoundCosts:
    """Milliseconds. A rank's forward costs ``decode_base + per_seq * decodes +
    per_kv_token * (context tokens the decodes attend over) + per_token * prefill_tokens``;
    the group's round costs the slowest rank, plus ``extend_overhead`` when any rank extends
    (eager path and DeepEP normal legs instead of the decode graph and low-latency legs),
    plus the metadata gather.

    Two engine delays sit beside the forward costs because they are part of what a client
    measures: ``schedule_lag_ms`` (a request reaches its rank's scheduler this long after it
    was sent: HTTP, tokenization, the hop to the engine process) and ``plan_ahead_rounds``
    (async scheduling: the next round is planned while the current one runs, so a request
    that becomes visible during round k is first planned in round k + 1 + this).
    """

    decode_base_ms: float = 0.0
    decode_per_seq_ms: float = 1.0
    prefill_per_token_ms: float = 0.1
    extend_overhead_ms: float = 0.0
    gather_ms: float = 0.0
    decode_per_kv_token_ms: float = 0.0
    schedule_lag_ms: float = 0.0
    plan_ahead_rounds: float = 0.0

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0:
                raise ValueError(f"cost {f.name} must be a number >= 0, got {value!r}")
        if self.plan_ahead_rounds != int(self.plan_ahead_rounds):
            raise ValueError(
                f"cost plan_ahead_rounds must be a whole number, got {self.plan_ahead_rounds}"
            )

    def rank_ms(self, decodes: int, prefill_tokens: int, kv_tokens: int = 0) -> float:
        """One rank's forward; an idle rank costs nothing of its own."""
        if decodes == 0 and prefill_tokens == 0:
            return 0.0
        return (
            self.decode_base_ms
            + self.decode_per_seq_ms * decodes
            + self.decode_per_kv_token_ms * kv_tokens
            + self.prefill_per_token_ms * prefill_tokens
        )

    def group_ms(self, rank_ms: Iterable[float], any_extend: bool) -> float:
        """The group's round: the slowest rank plus the shared overheads."""
        slowest = max(rank_ms, default=0.0)
        return slowest + self.gather_ms + (self.extend_overhead_ms if any_extend else 0.0)


# Every field can be set from ``--costs FILE.json`` and overridden by its own flag.
COST_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(RoundCosts))


TOY = RoundCosts()

# DeepSeek-V3/R1-class MoE under attention DP + DeepEP. Sources per field: docs/cost-model.md.
PRESETS: dict[str, RoundCosts] = {
    "toy": TOY,
    "h100-dsv3": RoundCosts(
        decode_base_ms=30.0,
        decode_per_seq_ms=0.25,
        prefill_per_token_ms=0.15,
        extend_overhead_ms=20.0,
        gather_ms=0.3,
    ),
    # Fitted to vLLM PR #44558 workload A (``roundgate simulate --scenario vllm-44558``).
    "gb200-dsv3": RoundCosts(
        decode_base_ms=28.0,
        decode_per_seq_ms=0.05,
        prefill_per_token_ms=0.13,
        extend_overhead_ms=90.0,
        gather_ms=0.2,
        decode_per_kv_token_ms=5e-6,
        plan_ahead_rounds=1,
    ),
}


def load_costs(spec: str, text: str | None = None) -> RoundCosts:
    """A preset by name, or a JSON object (``text``, read by the caller from ``spec``).

    A JSON file may name a ``"base"`` preset and override any field; unknown keys are refused.
    """
    import json

    if text is None:
        if spec not in PRESETS:
            raise ValueError(
                f"--costs: unknown preset {spec!r} (presets: {', '.join(PRESETS)}; or a .json file)"
            )
        return PRESETS[spec]
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"--costs {spec}: invalid JSON ({exc})") from exc
    if not isinstance(obj, dict):
        raise ValueError(f"--costs {spec}: expected a JSON object")
    obj.pop("_source", None)  # provenance written by ``roundgate calibrate``; not a cost
    base = obj.pop("base", "toy")
    if base not in PRESETS:
        raise ValueError(f"--costs {spec}: unknown base preset {base!r}")
    unknown = sorted(set(obj) - set(COST_FIELDS))
    if unknown:
        raise ValueError(f"--costs {spec}: unknown fields {unknown} (known: {sorted(COST_FIELDS)})")
    values = {name: getattr(PRESETS[base], name) for name in COST_FIELDS} | obj
    return RoundCosts(**values)
