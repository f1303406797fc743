"""Seeded synthetic workloads for the group simulator: arrivals, lengths and routing."""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from deployment.routing.cache_aware import CacheAwareConfig, CacheAwarePolicy
from sim.vllm_lb import VllmBalancer

if TYPE_CHECKING:
    from sim.sessions import Session

ARRIVALS = ("poisson", "bursty", "trace")
LENGTH_DISTS = ("fixed", "uniform", "exponential")
ROUTERS = ("round-robin", "least-loaded", "skewed", "vllm-lb", "cache-aware")


@dataclass(frozen=True)
class WorkloadPreset:
    """Mean prompt and output lengths of a published workload (CALIBRATION.md) and the
    distribution drawn around them (uniform, mean +-50 %: the sources give means only)."""

    input_len: int
    output_len: int
    length_dist: str = "uniform"


WORKLOADS: dict[str, WorkloadPreset] = {
    "chat": WorkloadPreset(230, 200),  # ShareGPT, SGLang PR #2643
    "agentic": WorkloadPreset(8596, 182),  # Mooncake tool-use traces
    "reasoning": WorkloadPreset(803, 3654),  # TRT-LLM blog 10
}


@dataclass(frozen=True, slots=True)
class Arrival:
    """One request of the workload: when it arrives and how long its prompt and output are."""

    time_s: float
    prompt_tokens: int
    output_tokens: int
    rank: int | None = None  # a pinned rank (traces may pin); None lets the router choose
    # A session's turn carries its prompt (a shared prefix and the conversation so far);
    # otherwise every prompt is distinct filler of ``prompt_tokens`` tokens.
    token_ids: tuple[int, ...] | None = field(default=None, repr=False, compare=False)
    session: Session | None = field(default=None, repr=False, compare=False)
    turn: int = 0


@dataclass(frozen=True)
class WorkloadSpec:
    """Everything that determines the arrival sequence; same spec and seed → same workload."""

    num_requests: int = 200
    arrival: str = "poisson"
    rate: float = 10.0  # requests/s (mean, for bursty too)
    burst_size: int = 8
    input_len: int = 1000
    output_len: int = 100
    length_dist: str = "fixed"
    trace: str | None = None
    seed: int = 0
    # Lengths uniform in [ratio x len, len] instead of ``length_dist`` (a benchmark client's
    # ``--random-range-ratio``, e.g. SGLang bench_serving and InferenceMax's 0.8).
    range_ratio: float | None = None

    def __post_init__(self) -> None:
        if self.arrival not in ARRIVALS:
            raise ValueError(
                f"--arrival must be one of {', '.join(ARRIVALS)}, got {self.arrival!r}"
            )
        if self.length_dist not in LENGTH_DISTS:
            raise ValueError(
                f"--length-dist must be one of {', '.join(LENGTH_DISTS)}, got {self.length_dist!r}"
            )
        if self.arrival == "trace" and not self.trace:
            raise ValueError("--arrival trace needs --trace PATH")
        for flag, value in (
            ("--num-requests", self.num_requests),
            ("--input-len", self.input_len),
            ("--output-len", self.output_len),
            ("--burst-size", self.burst_size),
        ):
            if value < 1:
                raise ValueError(f"{flag} must be >= 1, got {value}")
        if not self.rate > 0:
            raise ValueError(f"--rate must be > 0, got {self.rate}")
        if self.range_ratio is not None and not 0 < self.range_ratio <= 1:
            raise ValueError(f"range_ratio must be in (0, 1], got {self.range_ratio}")


def _length(rng: random.Random, mean: int, dist: str, ratio: float | None = None) -> int:
    if ratio is not None:
        return rng.randint(max(1, int(mean * ratio)), mean)
    if dist == "fixed":
        return mean
    if dist == "uniform":
        return rng.randint(max(1, mean // 2), max(1, mean * 3 // 2))
    return max(1, round(rng.expovariate(1.0 / mean)))


def generate(spec: WorkloadSpec) -> list[Arrival]:
    """The arrival list of ``spec``, sorted by time."""
    if spec.arrival == "trace":
        return load_trace(Path(spec.trace or ""))
    rng = random.Random(spec.seed)
    arrivals: list[Arrival] = []
    t = 0.0
    while len(arrivals) < spec.num_requests:
        if spec.arrival == "poisson":
            t += rng.expovariate(spec.rate)
            count = 1
        else:  # bursty: bursts of burst_size with the same mean request rate
            t += rng.expovariate(spec.rate / spec.burst_size)
            count = spec.burst_size
        for _ in range(min(count, spec.num_requests - len(arrivals))):
            arrivals.append(
                Arrival(
                    t,
                    _length(rng, spec.input_len, spec.length_dist, spec.range_ratio),
                    _length(rng, spec.output_len, spec.length_dist, spec.range_ratio),
                )
            )
    return arrivals


def load_trace(path: Path) -> list[Arrival]:
    """JSONL, one object a line: ``{"time_s", "prompt_tokens", "output_tokens", "rank"?}``."""
    try:
        lines = path.read_text().splitlines()
    except OSError as exc:
        raise ValueError(f"--trace {path}: cannot read ({exc.strerror})") from exc
    arrivals = []
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
            arrival = Arrival(
                float(obj["time_s"]),
                int(obj["prompt_tokens"]),
                int(obj["output_tokens"]),
                None if obj.get("rank") is None else int(obj["rank"]),
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"--trace {path}:{lineno}: bad record ({exc})") from exc
        if arrival.prompt_tokens < 1 or arrival.output_tokens < 1 or arrival.time_s < 0:
            raise ValueError(f"--trace {path}:{lineno}: lengths must be >= 1 and time >= 0")
        arrivals.append(arrival)
    if not arrivals:
        raise ValueError(f"--trace {path}: no records")
    return sorted(arrivals, key=lambda a: a.time_s)


class Router:
    """Chooses a rank for each arrival: round-robin, least-loaded, fixed skewed weights, or
    vLLM's internal load balancer (``vllm-lb``: least ``4 x waiting + running`` on counts
    refreshed every 100 ms, so requests sent since the engines last reported are invisible
    to it after a refresh), or cache-aware (``deployment.routing.cache_aware``)."""

    def __init__(
        self,
        policy: str,
        dp_size: int,
        weights: Sequence[int] | None = None,
        seed: int = 0,
        cache_aware: CacheAwareConfig | None = None,
        api_servers: int | None = None,
    ) -> None:
        if policy not in ROUTERS:
            raise ValueError(f"--router must be one of {', '.join(ROUTERS)}, got {policy!r}")
        if policy == "skewed":
            if weights is None or len(weights) != dp_size:
                raise ValueError(
                    f"--route-weights needs {dp_size} weights (one per rank) for --router "
                    f"skewed, got {list(weights or [])}"
                )
            if any(w < 0 for w in weights) or sum(weights) == 0:
                raise ValueError("--route-weights must be >= 0 with a positive sum")
        elif weights is not None:
            raise ValueError(f"--route-weights applies to --router skewed only, not {policy}")
        if api_servers is not None and policy != "vllm-lb":
            raise ValueError(f"--lb-api-servers applies to --router vllm-lb only, not {policy}")
        self.policy = policy
        self.dp_size = dp_size
        self.weights = list(weights or [])
        self._next = 0
        self._rng = random.Random(seed)
        self.vllm_lb = (
            VllmBalancer(dp_size, 1 if api_servers is None else api_servers, seed)
            if policy == "vllm-lb"
            else None
        )
        self.cache_aware = (
            CacheAwarePolicy(cache_aware or CacheAwareConfig()) if policy == "cache-aware" else None
        )

    def route(
        self, loads: Sequence[int], token_ids: Sequence[int] = (), session: str | None = None
    ) -> int:
        """``loads`` is each rank's unfinished request count; the cache-aware router also
        reads the prompt (and the session key, with affinity on)."""
        if self.cache_aware is not None:
            ranks = range(self.dp_size)
            return int(self.cache_aware.choose(ranks, loads, token_ids, session).rank)
        if self.policy == "round-robin":
            rank = self._next
            self._next = (self._next + 1) % self.dp_size
            return rank
        if self.policy == "least-loaded":
            return min(range(self.dp_size), key=lambda r: (loads[r], r))
        return self._rng.choices(range(self.dp_size), weights=self.weights)[0]

    def route_stale(self, now_s: float, waiting: Sequence[int], running: Sequence[int]) -> int:
        """``vllm-lb`` (``sim.vllm_lb``): route on the last refreshed counts."""
        if self.vllm_lb is None:
            raise ValueError(f"route_stale is the vllm-lb router's, not {self.policy}'s")
        return self.vllm_lb.route(now_s, waiting, running)
