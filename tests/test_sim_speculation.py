"""Speculative decoding in the simulator: the live scheduler verifies drafts that the cost
executor keeps at the stated rate, so a run's requests still end at their lengths, decoding
takes fewer rounds as the acceptance rises, and each flag is refused by name."""

from __future__ import annotations

import pytest
from sim_builders import make_spec, sim_args

from roundgate.cli.main import build_parser
from roundgate.sim.options import sim_specs
from roundgate.sim.round_costs import PRESETS
from roundgate.sim.spec import SimSpec, simulate
from roundgate.sim.speculation import Acceptance, SpecSim


def run(speculation: SpecSim | None, dp: int = 2):
    spec = SimSpec(
        sim_args("roundgate", dp_size=dp),
        make_spec(num_requests=24, output_len=40, length_dist="fixed"),
        PRESETS["h100-dsv3"],
        speculation=speculation,
    )
    return simulate(spec)


def test_expected_yield_is_the_geometric_sum() -> None:
    assert SpecSim(1, 0.8).expected_tokens() == pytest.approx(1.8)
    assert SpecSim(3, 0.5).expected_tokens() == pytest.approx(1 + 0.5 + 0.25 + 0.125)


def test_seeded_acceptance_draws_keep_drafts_left_to_right_at_the_rate() -> None:
    draws = Acceptance(SpecSim(4, 0.6), seed=3)
    kept = [draws.kept(4) for _ in range(20_000)]
    mean = sum(kept) / len(kept)
    assert mean == pytest.approx(0.6 + 0.36 + 0.216 + 0.1296, abs=0.03)
    assert max(kept) == 4 and min(kept) == 0
    again = Acceptance(SpecSim(4, 0.6), seed=3)
    assert [again.kept(4) for _ in range(100)] == kept[:100]


def test_drafts_shorten_decoding_and_every_request_keeps_its_length() -> None:
    plain = run(None)
    fast = run(SpecSim(3, 0.8))
    for result in (plain, fast):
        assert all(r.num_output == 40 for r in result.records)  # max_tokens holds
    assert fast.decode_rounds < 0.6 * plain.decode_rounds
    assert fast.duration_s < plain.duration_s
    never = run(SpecSim(3, 0.0))  # every draft rejected: one token a round, dearer rounds
    assert never.decode_rounds == pytest.approx(plain.decode_rounds, rel=0.05)
    assert all(r.num_output == 40 for r in never.records)


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (["--spec-tokens", "0"], "--spec-tokens"),
        (["--spec-tokens", "2", "--spec-acceptance", "1.0"], "--spec-acceptance"),
        (["--spec-tokens", "2", "--spec-draft-share", "2"], "--spec-draft-share"),
    ],
)
def test_bad_flags_are_refused_by_name(flags: list[str], named: str) -> None:
    ns = build_parser().parse_args(["simulate", "--num-requests", "4", *flags])
    with pytest.raises(ValueError, match=named):
        sim_specs(ns)
