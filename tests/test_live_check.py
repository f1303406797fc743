"""The simulator, priced from the live CPU deployment, predicts that deployment's own bench.

The data are the recorded live runs (``docs/bench/live_{below,past}.json``: our bench client
against the real default model, dp=2, round-robin, four policies at 0.2 and 0.5 req/s) and the
engine scrapes taken before and after each run (``docs/bench/scrapes/``). One ``--costs`` file is
fitted over the scrapes, each run's workload is replayed in the simulator, and TTFT p50 and ITL
p50 must fall within the issue's ±25 % of what the client measured, for the gate and for
``none`` — also when the fit saw only those two policies' runs and predicts the other two.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from roundgate.sim.live_check import TOLERANCE, predict

# The documented misses, as bounds rather than as misses that must persist: a better model
# moves these errors toward 0 and still passes; a worse one fails. Both are the recorded
# runs' own figures (deterministic), with the margin to the bound stated.
# Fit on 0.2 req/s, ITL p50 at 0.5 req/s: the decode round is not linear in the batch on this
# host, so the light load's per-sequence price over-charges the heavier batch. Today +29 % to
# +43 % (docs/simulator.md); never under-predicted past the ±25 %, never over by more than 50 %.
CROSS_LOAD_ITL = (-TOLERANCE, 0.50)
# `none` on seeds 1-2, fitted on seed 0: the light runs shared the two cores with other work,
# so a round's live cost moved more than the seeds' workloads do. Today within ±45 %; ±50 %.
NONE_ACROSS_SEEDS = 0.50

DOCS = Path(__file__).resolve().parents[1] / "docs" / "bench"
BENCHES = [DOCS / "live_below.json", DOCS / "live_past.json"]
SCRAPES = [DOCS / "scrapes" / "below", DOCS / "scrapes" / "past"]


@pytest.mark.parametrize("fit_from", [None, {"roundgate", "none"}], ids=["all-runs", "held-out"])
def test_live_runs_are_predicted_within_tolerance(fit_from, tmp_path: Path) -> None:
    costs, rows = predict(BENCHES, SCRAPES, fit_from, tmp_path / "costs.json")
    checked = [r for r in rows if r["checked"]]
    # 2 loads x 3 policies x (TTFT p50, ITL p50): the roundgate-auto runs are of the gate
    # before issue 37's redesign, replayed and shown but not held to (the reports say so).
    assert len(checked) == 12
    superseded = [r for r in rows if r.get("superseded")]
    assert {r["policy"] for r in superseded} == {"roundgate-auto"} and len(superseded) == 8
    assert not any(r["checked"] for r in superseded)
    assert {r["policy"] for r in checked} >= {"roundgate", "none"}
    for row in checked:
        assert abs(row["error"]) <= TOLERANCE, row
    # The fit found a real per-token prefill price and a decode price (not a degenerate file).
    assert costs["prefill_per_token_ms"] > 0 and costs["decode_base_ms"] > 0


def test_a_fit_on_one_load_predicts_the_other_loads_ttft_not_its_itl(tmp_path: Path) -> None:
    # Fitted on the 0.2 req/s runs only, predicting the 0.5 req/s runs: TTFT p50 holds the
    # ±25 %, ITL p50 does not. The decode round is not linear in the batch on this host (the
    # per-sequence price fitted at one load is 53 ms at 0.2 req/s, 34 ms at 0.5 req/s), so
    # the light load's price over-charges the heavier batches (docs/simulator.md).
    _, rows = predict(BENCHES, SCRAPES, None, tmp_path / "costs.json", {"live_below.json"})
    predicted = [r for r in rows if r["checked"] and not r["fitted"]]
    assert {r["bench"] for r in predicted} == {"live_past.json"} and len(predicted) == 6
    for row in predicted:
        if row["figure"] == "TTFT p50":
            assert abs(row["error"]) <= TOLERANCE, row
        else:  # the named miss, bounded: over-predicted at most, as documented
            low, high = CROSS_LOAD_ITL
            assert low <= row["error"] <= high, row


def test_a_fit_bench_that_is_not_given_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"--fit-bench live_nowhere\.json"):
        predict(BENCHES, SCRAPES, None, tmp_path / "costs.json", {"live_nowhere.json"})


SEEDS = [
    (DOCS / f"live_{load}_seed{seed}.json", DOCS / "scrapes" / f"{load}_seed{seed}")
    for seed in (0, 1, 2)
    for load in ("below", "past")
]


def test_a_seed_0_fit_predicting_seeds_1_and_2_holds_the_gates_ttft_and_names_its_misses(
    tmp_path: Path,
) -> None:
    # Later runs on today's code (the gate and none, both loads, seeds 0-2): fitted on seed 0's
    # two runs, the other seeds' arrivals are predicted. The gate's TTFT p50 and ITL p50 hold
    # the ±25 % on all four predicted runs; `none` stays within NONE_ACROSS_SEEDS (today it
    # misses the ±25 % on five of its eight P50 figures, all but one by under-pricing).
    benches, scrapes = zip(*SEEDS, strict=True)
    fit = {"live_below_seed0.json", "live_past_seed0.json"}
    _, rows = predict(list(benches), list(scrapes), None, tmp_path / "costs.json", fit)
    predicted = [r for r in rows if r["checked"] and not r["fitted"]]
    assert len(predicted) == 16  # 2 seeds x 2 loads x 2 policies x (TTFT p50, ITL p50)
    gate = [r for r in predicted if r["policy"] == "roundgate"]
    assert len(gate) == 8
    for row in gate:
        assert abs(row["error"]) <= TOLERANCE, row
    none = [r for r in predicted if r["policy"] == "none"]
    assert len(none) == 8
    for row in none:
        assert abs(row["error"]) <= NONE_ACROSS_SEEDS, row
