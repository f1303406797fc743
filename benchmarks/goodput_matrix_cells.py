"""The cells of the goodput matrix: workload x dp x load, and one seeded run of one arm in one.

A cell fixes the workload shape, the group size, the load and the SLO; every arm (each
registered policy at its simulate defaults, and the fixed gate at every pair of the tune grid)
runs on the same arrivals for a seed. Loads are fractions of the workload's saturation rate
under ``none`` at dp=8 on ``h100-dsv3`` (measured with a closed loop of 1,024 clients:
``roundgate simulate --dp-size 8 --costs h100-dsv3 --workload W --concurrency 1024``), scaled
with the group size; the closed-loop long-prefill regime varies its clients instead.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Any

from common import run_record

from roundgate.actors.server_args import ServerArgs
from roundgate.gate import registry
from roundgate.sim.goodput import Slo
from roundgate.sim.options import GROUP_DEFAULTS
from roundgate.sim.regimes import REGIMES
from roundgate.sim.round_costs import PRESETS
from roundgate.sim.spec import SimSpec, simulate
from roundgate.sim.speculation import SpecSim
from roundgate.sim.workload import WORKLOADS, WorkloadSpec, generate

COSTS = "h100-dsv3"
# One MTP draft step: one decoder layer of DeepSeek-V3's 61 (benchmarks/spec_sim.py).
MTP_DRAFT_SHARE = 1 / 61
LOADS = {"below": 0.35, "near": 0.8, "past": 1.2}
# Requests a second each workload sustains under ``none`` at dp=8 (see the module docstring).
SATURATION_RPS = {"chat": 34.0, "agentic": 1.25, "reasoning": 3.75, "bursty": 34.0}
# Closed-loop clients of the long-prefill regime at dp=8, per load (its own setup is 32).
LONG_PREFILL_CLIENTS = {"below": 16, "near": 32, "past": 64}
# Requests an arm sends at dp=8 (x4 at dp=128): enough for stable percentiles, kept short for
# long outputs, whose runs last minutes of simulated time.
REQUESTS = {"chat": 800, "bursty": 800, "agentic": 200, "reasoning": 150}
# TTFT bounds judged with ITL p99 <= 200 ms: a prompt's own prefill sets the floor (an 8.6k
# agentic prompt prefills in ~1.3 s on this preset by itself).
SLOS = {
    "chat": Slo(2000.0, 200.0),
    "bursty": Slo(2000.0, 200.0),
    "reasoning": Slo(2000.0, 200.0),
    # An 8.6k prompt is two 8k chunk rounds of ~1.3 s each: every stream running beside one
    # sees such a gap, so the ITL bound admits one chunk round, as the long-prefill regime's.
    "agentic": Slo(10_000.0, 1500.0),
    "long-prefill": REGIMES["long-prefill-chunked"].slo,
}
WORKLOAD_NAMES = ("chat", "agentic", "reasoning", "long-prefill", "bursty")


@dataclass(frozen=True)
class Cell:
    workload: str
    dp: int
    load: str
    # Speculative decoding, ``kKaA`` (K drafts per decode, each kept with chance A, priced as
    # DeepSeek's MTP: a draft step 1/61 of a decode forward); "" for none.
    spec: str = ""

    @property
    def key(self) -> str:
        base = f"{self.workload}/dp{self.dp}/{self.load}"
        return f"{base}/{self.spec}" if self.spec else base

    @property
    def speculation(self) -> SpecSim | None:
        if not self.spec:
            return None
        found = re.fullmatch(r"k(\d+)a([0-9.]+)", self.spec)
        if found is None:
            raise ValueError(f"--spec {self.spec!r}: expected kKaA, e.g. k2a0.7")
        return SpecSim(int(found[1]), float(found[2]), MTP_DRAFT_SHARE)

    @property
    def slo(self) -> Slo:
        return SLOS[self.workload]


@dataclass(frozen=True)
class Arm:
    """A policy at its simulate defaults, or the fixed gate at one (attempt, any) pair."""

    label: str
    policy: str
    flags: tuple[tuple[str, Any], ...] = ()


def arms(pairs: list[tuple[int, int]]) -> list[Arm]:
    out = [Arm(name, name) for name in registry.names()]
    for attempt, any_ in pairs:
        flags = (("prefill_attempt_interval", attempt), ("prefill_any_attempt_interval", any_))
        out.append(Arm(f"roundgate {attempt}/{any_}", "roundgate", flags))
    return out


def _args(dp: int, engine: dict[str, Any]) -> ServerArgs:
    """``roundgate simulate``'s group defaults, then the workload's engine; the group's
    ``max_num_seqs`` grows with it (the same per rank)."""
    flags = {k: v for k, v in GROUP_DEFAULTS.items() if k != "dp_size"} | engine
    flags["max_num_seqs"] = flags["max_num_seqs"] * dp // 8
    return ServerArgs(dp_size=dp, enable_prefix_caching=False, **flags)


def _spec(cell: Cell, seed: int) -> tuple[ServerArgs, Any, int | None]:
    scale = cell.dp // 8
    if cell.workload == "long-prefill":
        regime = REGIMES["long-prefill-chunked"]
        clients = LONG_PREFILL_CLIENTS[cell.load] * scale
        args = _args(cell.dp, dict(regime.engine))
        return args, regime.arrivals(4 * clients, seed), clients
    rate = SATURATION_RPS[cell.workload] * LOADS[cell.load] * scale
    count = REQUESTS[cell.workload] * (2 if cell.dp > 8 else 1)
    if cell.workload == "bursty":
        base = dataclasses.replace(REGIMES["bursty"].workload, rate=rate, num_requests=count)
        workload = dataclasses.replace(base, seed=seed)
        engine = dict(REGIMES["bursty"].engine)
    else:
        preset = WORKLOADS[cell.workload]
        workload = WorkloadSpec(
            num_requests=count,
            rate=rate,
            input_len=preset.input_len,
            output_len=preset.output_len,
            length_dist=preset.length_dist,
            seed=seed,
        )
        engine = {}
    return _args(cell.dp, engine), tuple(generate(workload)), None


def run_arm(cell: Cell, arm: Arm, seed: int) -> dict[str, Any]:
    """One seeded run: goodput under the cell's SLO, TTFT and ITL p50/p99."""
    args, arrivals, clients = _spec(cell, seed)
    given = dict(arm.flags)
    spec = SimSpec(
        args,
        arrivals,
        PRESETS[COSTS],
        seed=seed,
        concurrency=clients,
        itl_slo_ms=cell.slo.itl_ms,
        speculation=cell.speculation,
    ).with_policy(arm.policy, given)
    return run_record(cell.key, arm.label, seed, simulate(spec), cell.slo)
