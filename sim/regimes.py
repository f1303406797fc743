"""The regimes operators meet, as named scenarios: ``roundgate simulate --scenario NAME``.

A published replay (``roundgate.sim.published``) holds a simulated figure against a published one. A
regime has no figure to match: it is a workload shape on which some policy is known to fall
into a bad state, run for every policy of interest on one setup, with the goodput under the
regime's own SLO and a regime report per arm (``roundgate.sim.regime_report``) that says whether the
group stayed healthy (prefill aligned across ranks) or fell LOW (the group stays "mixed").

- ``long-prefill-chunked``: the shape of SGLang #35241 (DP attention, chunked prefill with a
  16k chunk, a long-prefill deterministic workload, closed loop): prompts uniform in
  20k-60k tokens, 256 output tokens, ``--max-scheduled-tokens 16384``, 32 clients at dp=8.
  There the same config lands healthy (~95k input tok/s) or LOW (62-79k) once ranks' prefill
  progress splits by whole chunks; issue 37 measured the adaptive gate giving back almost all
  of the fixed gate's win on it.
- ``bursty``: vLLM #54627's complaint: under bursty arrivals the prefill schedule interval
  makes TTFT worse, and the best interval differs ~10x between workloads (2 vs 33): chat
  lengths arriving in bursts of 16 at 24 req/s on average, dp=8.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from roundgate.sim.arrivals import Arrival
from roundgate.sim.goodput import Slo
from roundgate.sim.scenario_spec import Arm
from roundgate.sim.workload import WorkloadSpec, generate


@dataclass(frozen=True)
class UniformPrompts:
    """Prompts uniform in ``[min_prompt_tokens, max_prompt_tokens]``, every output
    ``output_tokens`` long: a deterministic long-prefill benchmark's shape, which
    ``WorkloadSpec`` (lengths drawn around one mean, the output's like the prompt's) cannot
    state."""

    num_requests: int
    min_prompt_tokens: int
    max_prompt_tokens: int
    output_tokens: int
    seed: int = 0

    def __post_init__(self) -> None:
        if self.num_requests < 1:
            raise ValueError(f"--scenario-requests must be >= 1, got {self.num_requests}")
        if not 1 <= self.min_prompt_tokens <= self.max_prompt_tokens:
            raise ValueError(
                f"prompt range [{self.min_prompt_tokens}, {self.max_prompt_tokens}] is empty"
            )
        if self.output_tokens < 1:
            raise ValueError(f"output_tokens must be >= 1, got {self.output_tokens}")

    def draw(self) -> tuple[Arrival, ...]:
        """The requests in send order (all at time 0: a closed loop sends them as its
        clients free up)."""
        rng = random.Random(self.seed)
        lo, hi = self.min_prompt_tokens, self.max_prompt_tokens
        return tuple(
            Arrival(0.0, rng.randint(lo, hi), self.output_tokens) for _ in range(self.num_requests)
        )


RegimeWorkload = UniformPrompts | WorkloadSpec


@dataclass(frozen=True)
class Regime:
    """A workload shape, the group it runs on, the policies compared and the SLO that
    decides which requests were served well."""

    source: str
    why: str  # what goes wrong on it, and for whom
    costs: str  # the cost preset
    dp_size: int
    workload: RegimeWorkload
    arms: tuple[Arm, ...]
    slo: Slo
    router: str = "round-robin"
    engine: Mapping[str, Any] = field(default_factory=dict)  # other ServerArgs
    concurrency: int | None = None  # closed-loop clients (None: the workload's arrivals)

    @property
    def num_requests(self) -> int:
        return self.workload.num_requests

    def arrivals(self, num_requests: int | None = None, seed: int = 0) -> tuple[Arrival, ...]:
        """The regime's requests, ``num_requests`` of them (None: its own count), drawn with
        ``seed``; every arm runs the same ones."""
        changes = {"seed": seed} | ({"num_requests": num_requests} if num_requests else {})
        fields = {n: getattr(self.workload, n) for n in self.workload.__dataclass_fields__}
        workload = type(self.workload)(**(fields | changes))
        if isinstance(workload, UniformPrompts):
            return workload.draw()
        return tuple(generate(workload))


GATE = {"prefill_attempt_interval": 4, "prefill_any_attempt_interval": 16}

REGIMES: dict[str, Regime] = {
    "long-prefill-chunked": Regime(
        source="SGLang #35241 (healthy ~95k vs LOW 62-79k input tok/s on one config); issue 37",
        why="a prompt's own prefill takes seconds (2-4 chunks of 16k): a rank mid-prompt keeps "
        "the group 'mixed', the others' decodes wait on its chunk rounds, and a TTFT budget "
        "of 500 ms is always exceeded, so a budgeted gate opens at every prompt",
        costs="h100-dsv3",
        dp_size=8,
        workload=UniformPrompts(
            num_requests=128, min_prompt_tokens=20_000, max_prompt_tokens=60_000, output_tokens=256
        ),
        concurrency=32,
        engine={
            "max_scheduled_tokens": 16384,
            "max_num_seqs": 1024,
            "page_size": 64,
            # Eight 60k prompts and their outputs on one rank (8 x ~60.3k / 64 pages).
            "num_kv_pages": 8192,
        },
        arms=(
            Arm("none", "none", {}, {}),
            Arm("roundgate", "roundgate", GATE, {}),
            Arm("roundgate-auto", "roundgate-auto", {}, {}),
            Arm("sglang-delayer", "sglang-delayer", {}, {}),
        ),
        # A prompt of 20k-60k tokens prefills in 3-9 s on this preset by itself: the TTFT
        # bound is priced against that (about 3x the longest one's), and the stream may stall
        # for a chunk round (~2.5 s) but not for two back to back.
        slo=Slo(ttft_ms=30_000.0, itl_ms=3_000.0),
    ),
    "bursty": Regime(
        source="vLLM #54627 (under bursts the prefill schedule interval makes TTFT worse; the "
        "best interval differs ~10x between workloads, 2 vs 33)",
        why="a burst fills every rank's queue at once: holding prompts for an interval adds "
        "the wait to a queue that is already long, and the interval that suits steady arrivals "
        "is wrong for bursts",
        costs="h100-dsv3",
        dp_size=8,
        workload=WorkloadSpec(
            num_requests=1024,
            arrival="bursty",
            rate=24.0,
            burst_size=16,
            input_len=230,
            output_len=200,
            length_dist="uniform",
        ),
        engine={
            "max_scheduled_tokens": 8192,
            "max_num_seqs": 1024,
            "page_size": 64,
            "num_kv_pages": 4096,
        },
        arms=(
            Arm("none", "none", {}, {}),
            Arm("vllm-interval 2", "vllm-interval", {"prefill_schedule_interval": 2}, {}),
            Arm("vllm-interval 33", "vllm-interval", {"prefill_schedule_interval": 33}, {}),
            Arm("roundgate", "roundgate", GATE, {}),
            Arm("roundgate-auto", "roundgate-auto", {}, {}),
            Arm("sglang-delayer", "sglang-delayer", {}, {}),
        ),
        slo=Slo(),
    ),
}
