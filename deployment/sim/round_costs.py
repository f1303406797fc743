"""Round costs for the group simulator: what one rank's forward and one group round cost."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, fields


@dataclass(frozen=True)
class RoundCosts:
    """Milliseconds. A rank's forward costs ``decode_base + per_seq * decodes +
    per_token * prefill_tokens``; the group's round costs the slowest rank, plus
    ``extend_overhead`` when any rank extends (eager path and DeepEP normal legs instead of
    the decode graph and low-latency legs), plus the metadata gather.
    """

    decode_base_ms: float = 0.0
    decode_per_seq_ms: float = 1.0
    prefill_per_token_ms: float = 0.1
    extend_overhead_ms: float = 0.0
    gather_ms: float = 0.0

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if not isinstance(value, int | float) or value < 0:
                raise ValueError(f"cost {f.name} must be a number >= 0, got {value!r}")

    def rank_ms(self, decodes: int, prefill_tokens: int) -> float:
        """One rank's forward; an idle rank costs nothing of its own."""
        if decodes == 0 and prefill_tokens == 0:
            return 0.0
        return (
            self.decode_base_ms
            + self.decode_per_seq_ms * decodes
            + self.prefill_per_token_ms * prefill_tokens
        )

    def group_ms(self, rank_ms: Iterable[float], any_extend: bool) -> float:
        """The group's round: the slowest rank plus the shared overheads."""
        slowest = max(rank_ms, default=0.0)
        return slowest + self.gather_ms + (self.extend_overhead_ms if any_extend else 0.0)


TOY = RoundCosts()

# Published round costs (CALIBRATION.md): DeepSeek-V3-class MoE under attention DP + DeepEP.
PRESETS: dict[str, RoundCosts] = {
    "toy": TOY,
    "h100-dsv3": RoundCosts(
        decode_base_ms=30.0,
        decode_per_seq_ms=0.25,
        prefill_per_token_ms=0.15,
        extend_overhead_ms=20.0,
        gather_ms=0.3,
    ),
    "gb200-dsv3": RoundCosts(
        decode_base_ms=25.0,
        decode_per_seq_ms=0.05,
        prefill_per_token_ms=0.05,
        extend_overhead_ms=20.0,
        gather_ms=0.2,
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
    base = obj.pop("base", "toy")
    if base not in PRESETS:
        raise ValueError(f"--costs {spec}: unknown base preset {base!r}")
    known = {f.name for f in fields(RoundCosts)}
    unknown = sorted(set(obj) - known)
    if unknown:
        raise ValueError(f"--costs {spec}: unknown fields {unknown} (known: {sorted(known)})")
    values = {f.name: getattr(PRESETS[base], f.name) for f in fields(RoundCosts)} | obj
    return RoundCosts(**values)
