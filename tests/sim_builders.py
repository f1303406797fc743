"""Builders for the simulator tests: a larger sim group, seeded workload specs, runs, traces."""

from __future__ import annotations

import json
from pathlib import Path

from builders import make_args

from roundgate.actors.server_args import ServerArgs
from roundgate.sim.report import summarize
from roundgate.sim.round_costs import PRESETS, RoundCosts
from roundgate.sim.router import RouterSpec
from roundgate.sim.spec import SimSpec
from roundgate.sim.spec import simulate as simulate_spec
from roundgate.sim.workload import WorkloadSpec

# A larger group than the builders' default: 16 running requests a rank, a 256-token round.
SIM_GROUP = {"max_scheduled_tokens": 256, "page_size": 16, "num_kv_pages": 256}
SIM_FLAGS = {
    "roundgate": {"prefill_any_attempt_interval": 6},
    "local-interval": {"prefill_decode_interval": 3},
}


def sim_args(policy: str = "roundgate", dp_size: int = 4, **overrides) -> ServerArgs:
    values = {"max_num_seqs": 16 * dp_size, **SIM_GROUP, **SIM_FLAGS.get(policy, {})}
    return make_args(dp_size, policy, **(values | overrides))


def make_spec(**overrides) -> WorkloadSpec:
    values = {
        "num_requests": 60,
        "arrival": "poisson",
        "rate": 40.0,
        "input_len": 120,
        "output_len": 12,
        "length_dist": "uniform",
        "seed": 7,
    }
    return WorkloadSpec(**(values | overrides))


def simulate(
    policy: str = "roundgate",
    spec: WorkloadSpec | None = None,
    router: str = "round-robin",
    weights: list[int] | None = None,
    costs: RoundCosts | None = None,
    **arg_overrides,
) -> dict:
    """One run's summary on the builders' group (the h100 preset unless ``costs``)."""
    workload = spec or make_spec()
    run = SimSpec(
        sim_args(policy, **arg_overrides),
        workload,
        costs or PRESETS["h100-dsv3"],
        RouterSpec(router, None if weights is None else tuple(weights)),
        seed=workload.seed,
        keep_timeline=True,
    )
    return summarize(simulate_spec(run))


def write_trace(path: Path, records: list[dict | str]) -> Path:
    lines = [r if isinstance(r, str) else json.dumps(r) for r in records]
    path.write_text("\n".join(lines) + "\n")
    return path
