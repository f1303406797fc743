"""Seeded synthetic workloads for the group simulator: arrival times and lengths, or a trace."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

from roundgate.sim.arrivals import Arrival

ARRIVALS = ("poisson", "bursty", "trace")
LENGTH_DISTS = ("fixed", "uniform", "exponential")


@dataclass(frozen=True)
class WorkloadPreset:
    """Mean prompt and output lengths of a published workload (docs/calibration.md) and the
    distribution drawn around them (uniform, mean +-50 %: the sources give means only)."""

    input_len: int
    output_len: int
    length_dist: str = "uniform"


WORKLOADS: dict[str, WorkloadPreset] = {
    "chat": WorkloadPreset(230, 200),  # ShareGPT, SGLang PR #2643
    "agentic": WorkloadPreset(8596, 182),  # Mooncake tool-use traces
    "reasoning": WorkloadPreset(803, 3654),  # TRT-LLM blog 10
}


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
