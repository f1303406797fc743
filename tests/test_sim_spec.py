"""The simulator's typed front door: a frozen ``SimSpec`` in, a ``SimResult`` out.

The command line only turns flags into specs; what it prints is what ``simulate`` returns for
them. A spec refuses what it could never run, naming the flag, before any round.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from sim_builders import make_spec, sim_args

from roundgate.cli.main import build_parser, main
from roundgate.sim.arrivals import Arrival
from roundgate.sim.options import policy_args, sim_specs
from roundgate.sim.report import summarize
from roundgate.sim.round_costs import PRESETS
from roundgate.sim.router import Router, RouterSpec
from roundgate.sim.sessions import SESSION_WORKLOADS, SessionSpec
from roundgate.sim.simulator import GroupSimulator
from roundgate.sim.spec import SimSpec, arrivals_of, simulate
from roundgate.sim.workload import generate

ARGV = [
    "simulate",
    "--dp-size", "2",
    "--max-num-seqs", "16",
    "--num-kv-pages", "64",
    "--page-size", "16",
    "--num-requests", "20",
    "--rate", "50",
    "--input-len", "64",
    "--output-len", "6",
    "--no-progress",
]  # fmt: skip


@pytest.mark.parametrize(
    "extra",
    [
        ("--compare", "roundgate,none"),
        ("--router", "skewed", "--route-weights", "3,1", "--costs", "h100-dsv3"),
        ("--concurrency", "4", "--router", "least-loaded"),
        ("--workload", "chat-sessions", "--num-sessions", "3", "--num-kv-pages", "256"),
    ],
)
def test_the_cli_prints_what_simulate_returns_for_its_specs(
    tmp_path: Path, extra: tuple[str, ...]
) -> None:
    out = tmp_path / "out.json"
    assert main([*ARGV, *extra, "--json", str(out)]) == 0
    specs = sim_specs(build_parser().parse_args([*ARGV, *extra]))
    assert json.loads(out.read_text())["results"] == [summarize(simulate(s)) for s in specs]


def test_a_spec_is_the_simulator_on_its_parts() -> None:
    args, workload, costs = sim_args("roundgate"), make_spec(), PRESETS["h100-dsv3"]
    spec = SimSpec(args, workload, costs, RouterSpec("least-loaded"), seed=3)
    by_hand = GroupSimulator(
        args, costs, Router("least-loaded", args.dp_size, seed=3), "roundgate", keep_timeline=False
    ).run(generate(workload))
    assert summarize(simulate(spec)) == summarize(by_hand)
    # A fresh group and router each time: the same spec, the same result.
    assert summarize(simulate(spec)) == summarize(simulate(spec))
    assert spec.policy == "roundgate"


def test_with_policy_is_that_policy_built_from_its_flags() -> None:
    group = {"dp_size": 2, "max_num_seqs": 16, "page_size": 16, "num_kv_pages": 64}
    base = SimSpec(policy_args("none", {}, **group))
    given = {"prefill_attempt_interval": 2, "prefill_any_attempt_interval": 8}
    assert base.with_policy("roundgate", given).args == policy_args("roundgate", given, **group)
    # Back to a policy without flags: the gate's flags do not follow.
    assert base.with_policy("roundgate", given).with_policy("none", {}).args == base.args


def _pinned(spec: SimSpec) -> SimSpec:
    return dataclasses.replace(spec, workload=(Arrival(0.0, 8, 2, rank=5),))


def _long_prompt(spec: SimSpec) -> SimSpec:
    return dataclasses.replace(spec, workload=(Arrival(0.0, 5000, 2),))


def _long_sessions(spec: SimSpec) -> SimSpec:
    sessions = SessionSpec(SESSION_WORKLOADS["agentic-sessions"], num_sessions=2)
    return dataclasses.replace(spec, workload=sessions)


@pytest.mark.parametrize(
    ("build", "flag"),
    [
        (lambda args: SimSpec(args, concurrency=0), "--concurrency"),
        (lambda args: SimSpec(args, max_rounds=0), "--max-rounds"),
        (lambda args: SimSpec(args, router=RouterSpec("skewed", (1, 1, 1))), "--route-weights"),
        (lambda args: SimSpec(args, router=RouterSpec("skewed")), "--route-weights"),
        (lambda args: SimSpec(args, router=RouterSpec("round-robin", (1, 1))), "--route-weights"),
        (lambda args: SimSpec(args, router=RouterSpec("least-loaded", api_servers=2)), "--lb-api"),
        (lambda args: SimSpec(args, router=RouterSpec("random")), "--router"),
    ],
)
def test_a_spec_refuses_what_it_cannot_run_naming_the_flag(build, flag: str) -> None:
    with pytest.raises(ValueError, match=flag):
        build(sim_args("roundgate", dp_size=2))


@pytest.mark.parametrize(
    ("change", "flag"),
    [
        (_pinned, "--dp-size 2"),
        (_long_prompt, "--input-len"),
        (_long_sessions, "--workload agentic-sessions"),
    ],
)
def test_arrivals_a_rank_could_never_run_are_refused_before_any_round(change, flag: str) -> None:
    spec = change(SimSpec(sim_args("roundgate", dp_size=2)))
    with pytest.raises(ValueError, match=flag):
        arrivals_of(spec)
    with pytest.raises(ValueError, match=flag):
        simulate(spec)
