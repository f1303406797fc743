"""Round costs for the group simulator: what one rank's forward and one group round cost.

Where each preset number comes from: docs/cost-model.md ("Calibrated presets").
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, fields

from roundgate.gate.costmodel import DECODE_COST_MS, PREFILL_COST_MS, iteration_time


@dataclass(frozen=True)
class RoundCosts:
    """Milliseconds. A rank's forward costs ``decode_base + per_seq * decodes +
    per_token * prefill_tokens + per_kv_token * (context tokens the decodes attend over)``
    (the toy model's ``iteration_time`` with a fixed and a context-length term; the defaults,
    the ``toy`` preset, are the toy model itself);
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
    decode_per_seq_ms: float = DECODE_COST_MS
    prefill_per_token_ms: float = PREFILL_COST_MS
    extend_overhead_ms: float = 0.0
    gather_ms: float = 0.0
    decode_per_kv_token_ms: float = 0.0
    schedule_lag_ms: float = 0.0
    plan_ahead_rounds: float = 0.0
    # Stop-the-world collections of an engine process (CPython's oldest generation), driven
    # by the work done: a rank collects after every ``gc_every_requests`` requests it
    # finishes (each leaves long-lived objects behind; CPython runs a full collection once
    # those pass a quarter of the long-lived heap), and the group's next busy round waits
    # ``gc_pause_per_request_ms`` per request in that rank's batch (the live objects walked).
    gc_every_requests: float = 0.0
    gc_pause_per_request_ms: float = 0.0
    # Prefill/decode disaggregation (``roundgate.sim.disaggregated``): moving a handoff's KV from
    # its prefill rank to its decode rank costs ``kv_transfer_base_ms`` (latency: setup and
    # completion) plus ``kv_transfer_per_token_ms`` per token slot of the pages moved (whole
    # pages move), during which both ends' links are busy. Fused runs never read them.
    kv_transfer_base_ms: float = 0.0
    kv_transfer_per_token_ms: float = 0.0

    def transfer_ms(self, num_pages: int, page_size: int) -> tuple[float, float]:
        """``(link busy, done after)`` in ms for moving ``num_pages`` pages."""
        busy = self.kv_transfer_per_token_ms * num_pages * page_size
        return busy, busy + self.kv_transfer_base_ms

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0:
                raise ValueError(f"cost {f.name} must be a number >= 0, got {value!r}")
        for name in ("plan_ahead_rounds", "gc_every_requests"):
            value = getattr(self, name)
            if value != int(value):
                raise ValueError(f"cost {name} must be a whole number, got {value}")

    def rank_ms(self, decodes: int, prefill_tokens: int, kv_tokens: int = 0) -> float:
        """One rank's forward; an idle rank costs nothing of its own."""
        if decodes == 0 and prefill_tokens == 0:
            return 0.0
        work = iteration_time(
            decodes, prefill_tokens, self.decode_per_seq_ms, self.prefill_per_token_ms
        )
        return self.decode_base_ms + work + self.decode_per_kv_token_ms * kv_tokens

    def group_ms(self, rank_ms: Iterable[float], any_extend: bool) -> float:
        """The group's round: the slowest rank plus the shared overheads."""
        slowest = max(rank_ms, default=0.0)
        return slowest + self.gather_ms + (self.extend_overhead_ms if any_extend else 0.0)

    def gc_period(self) -> int:
        """Requests a rank finishes between two of its collections, 0 for none."""
        if not self.gc_every_requests or not self.gc_pause_per_request_ms:
            return 0
        return int(self.gc_every_requests)

    def gc_first(self, dp_size: int) -> list[int]:
        """Each rank's requests until its first collection: staggered by ``period / dp`` (the
        engine processes did not start with the same heap), so a balanced group collects
        once every ``period`` requests it finishes, one rank at a time."""
        period = self.gc_period()
        return [max(1, (rank + 1) * period // dp_size) for rank in range(dp_size)]

    def gc_pause_ms(self, batch: int) -> float:
        """The stall of one collection on a rank whose batch holds ``batch`` requests (the
        live objects the collector walks grow with the requests it runs)."""
        return self.gc_pause_per_request_ms * batch


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
        # P/D over RDMA (docs/pd.md): Mooncake's transfer engine moves 190 GB/s over 8 x 400
        # Gbps RoCE NICs, ~24 GB/s for each GPU's NIC; DeepSeek-V3's BF16 MLA latent is 61 x
        # 576 x 2 = 70,272 B a token -> 2.96 us a token. Latency: Mooncake's vLLM benchmark
        # moved a 128-token prompt (20 MB) in 0.54 ms, ~0.4 ms over its bandwidth share.
        kv_transfer_base_ms=0.4,
        kv_transfer_per_token_ms=0.00296,
    ),
    # Fitted to vLLM PR #44558 workload A (``roundgate simulate --scenario vllm-44558``).
    "gb200-dsv3": RoundCosts(
        decode_base_ms=28.0,
        decode_per_seq_ms=0.05,
        # Derived, not fitted: ~74 GFLOP a token (2 x 37 B active parameters) at ~40 % of a
        # GB200's ~10 PFLOP/s dense FP4 (docs/cost-model.md section 5).
        prefill_per_token_ms=0.02,
        extend_overhead_ms=215.0,
        gather_ms=0.2,
        decode_per_kv_token_ms=5e-6,
        plan_ahead_rounds=1,
        # The engine processes' stop-the-world collections, driven by requests finished,
        # fitted to the P99 TTFT of both arms: each rank every 600 of its requests (the group
        # every 600), 12 ms per request it runs.
        gc_every_requests=600,
        gc_pause_per_request_ms=12.0,
        # P/D inside one NVL72 over NVLink 5 (docs/pd.md): 900 GB/s a direction per GPU at
        # Mooncake's measured 71 % peak utilisation, ~640 GB/s; FP8 latent ~40,016 B a token
        # (as decode_per_kv_token_ms) -> 0.0625 us a token. Latency as h100-dsv3.
        kv_transfer_base_ms=0.4,
        kv_transfer_per_token_ms=0.0000625,
    ),
    # One SGLang engine, TEP4, Qwen3.5-397B-A17B-FP8 on 1x GB200 (SGLang PR #23189): decode
    # from its ISL-10 run (9,018 tok/s at concurrency 128: a 14.2 ms step) and TPOT at
    # concurrency 4; per prefill token from ISL 1,000 vs 10 with fixed lengths (7,830 vs 9,018);
    # the extend round's fixed cost fitted to its baseline arm (3,747 tok/s).
    "gb200-qwen35-tep4": RoundCosts(
        decode_base_ms=9.5,
        decode_per_seq_ms=0.037,
        prefill_per_token_ms=0.015,
        extend_overhead_ms=140.0,
        gather_ms=0.0,
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
