"""A new prefill policy is one file plus one registration: this file is that file.

It declares a policy the way ``gate/*.py`` do (a frozen config whose fields are its flags, a
class with its extra gather columns and, from ``RoundByRound``, no closed form for quiet
rounds, a ``PolicySpec``), registers it, and runs it through the
engine's flags, the serve config, ``ServerArgs`` and ``roundgate simulate --policy`` without
any other file knowing it exists.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from roundgate.actors.server_args import ServerArgs
from roundgate.cli.engine_flags import parse_server_args
from roundgate.cli.main import main
from roundgate.deployment.config import AppArgs
from roundgate.gate import registry
from roundgate.gate.policy import RoundByRound
from roundgate.gate.rows import RankRow, RoundView
from roundgate.gate.spec import PolicyContext, PolicySpec
from roundgate.gate.vote import CLOSED, OPEN, GateVote
from roundgate.sim.arrivals import Arrival
from roundgate.sim.round_costs import TOY
from roundgate.sim.router import Router
from roundgate.sim.simulator import POINT_CODES, GroupSimulator


@dataclass(frozen=True)
class EveryNthConfig:
    period: int = field(default=3, metadata={"help": "open on every N-th busy round"})

    def __post_init__(self) -> None:
        if self.period < 1:
            raise ValueError(f"--every-nth-period must be >= 1, got {self.period}")


class EveryNth(RoundByRound):
    """Opens on every ``period``-th round of the group while anyone waits (a shared clock)."""

    extra_columns = ("waiting",)

    def __init__(self, config: EveryNthConfig, ctx: PolicyContext) -> None:
        self.period = config.period
        self.rounds = 0
        self.opened: list[bool] = []

    def vote(self, rows: Sequence[RankRow], local: Any = None) -> GateVote:
        waiting = any(row.extras[0] > 0 or row.wants_prefill for row in rows)
        vote = OPEN if waiting and self.rounds % self.period == 0 else CLOSED
        self.opened.append(vote.open)
        return vote

    def observe(self, rows: Sequence[RankRow], view: RoundView) -> None:
        self.rounds = 0 if view.all_idle else self.rounds + 1


SPEC = PolicySpec(
    name="every-nth",
    summary="test plugin: prefill on every N-th round",
    config=EveryNthConfig,
    build=EveryNth,
    flag_prefix="every_nth_",
)


@pytest.fixture
def plugin() -> Iterator[PolicySpec]:
    registry.register(SPEC)
    yield SPEC
    registry.unregister(SPEC.name)


def test_the_registry_derives_its_flag_everywhere(plugin: PolicySpec) -> None:
    assert "every-nth" in registry.names()
    args = parse_server_args(["--prefill-policy", "every-nth", "--every-nth-period", "5"])
    assert args.prefill_policy_name == "every-nth"
    assert args.policy_flags["every_nth_period"] == 5
    assert args.policy_config_as(EveryNthConfig) == EveryNthConfig(5)
    assert isinstance(args.build_policy(1), EveryNth)
    served = AppArgs.model_validate({"prefill_policy": "every-nth", "every_nth_period": 2})
    assert served.server_args().policy_config == EveryNthConfig(2)
    assert ServerArgs(**args.to_dict()) == args


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"prefill_policy": "every-nth", "every_nth_period": 0}, "--every-nth-period must be >= 1"),
        ({"prefill_policy": "every-nth", "every_nth_period": "2"}, "must be an integer"),
        ({"every_nth_period": 2}, "--every-nth-period applies to --prefill-policy every-nth"),
    ],
)
def test_its_refusals_name_its_flag(plugin: PolicySpec, values: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ServerArgs(**values)


def test_a_clashing_flag_is_refused(plugin: PolicySpec) -> None:
    clash = PolicySpec("other", "", EveryNthConfig, EveryNth, flag_prefix="every_nth_")
    with pytest.raises(ValueError, match="--every-nth-period already belongs to 'every-nth'"):
        registry.register(clash)


def test_the_simulator_runs_it_and_prefill_follows_its_votes(plugin: PolicySpec) -> None:
    args = ServerArgs(
        dp_size=2,
        max_num_seqs=16,
        page_size=4,
        num_kv_pages=256,
        prefill_policy="every-nth",
        every_nth_period=4,
    )
    arrivals = [Arrival(0.001 * i, 8, 6) for i in range(12)]
    sim = GroupSimulator(args, TOY, Router("round-robin", 2, None, 0), "every-nth")
    result = sim.run(arrivals)
    assert result.unfinished == 0 and result.prefill_rounds > 0
    assert all(r.num_output == 6 for r in result.records)
    # A round extended only where the plugin's vote opened, on both ranks.
    timeline = result.timeline
    for i, opened in enumerate(timeline.opened):
        kinds = timeline.kinds[2 * i : 2 * i + 2]
        if any(k in (2, 3) for k in kinds):  # a rank ran prefill
            assert opened, f"round {i} ran prefill under a closed vote"
    assert POINT_CODES[None] in timeline.points  # the plugin votes without attempt points
    votes = [loop.policy.opened for loop in sim.loops]
    assert votes[0] == votes[1] and not all(votes[0])


def test_roundgate_simulate_takes_it_by_name(plugin: PolicySpec, tmp_path: Path) -> None:
    out = tmp_path / "run.json"
    argv = ["simulate", "--policy", "every-nth", "--every-nth-period", "2", "--dp-size", "2"]
    argv += ["--num-requests", "16", "--rate", "50", "--input-len", "32", "--output-len", "8"]
    argv += ["--costs", "toy", "--no-progress", "--json", str(out)]
    assert main(argv) == 0
    report = json.loads(out.read_text())
    (result,) = report["results"]
    assert result["policy"] == "every-nth" and result["unfinished"] == 0
    assert report["config"]["every_nth_period"] == 2
