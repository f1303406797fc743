"""``roundgate simulate --scenario REGIME``: every arm of a regime on its setup, with each
arm's summary, goodput under the regime's SLO and regime report (healthy or LOW)."""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from roundgate.actors.server_args import ServerArgs
from roundgate.gate import registry
from roundgate.sim.goodput import Goodput, Slo, format_goodputs, goodput
from roundgate.sim.regime_report import RegimeReport, format_reports, regime_report
from roundgate.sim.regimes import REGIMES, Regime
from roundgate.sim.report import format_table, summarize
from roundgate.sim.round_costs import PRESETS, RoundCosts
from roundgate.sim.router import RouterSpec
from roundgate.sim.scenario_spec import Arm
from roundgate.sim.spec import SimSpec, simulate


@dataclass(frozen=True)
class ArmRun:
    """What one arm of a regime gave."""

    label: str
    summary: dict[str, Any]
    goodput: Goodput
    regime: RegimeReport


def regime_arms(regime: Regime, compare: str | None, given: dict[str, Any]) -> tuple[Arm, ...]:
    """The regime's own arms, or ``--compare``'s policies with their flags as given (else
    simulate's defaults)."""
    if compare is None:
        return regime.arms
    names = list(registry.names()) if compare == "all" else [s.strip() for s in compare.split(",")]
    known = registry.names()
    for name in names:
        if name not in known:
            raise ValueError(f"--compare: unknown policy {name!r} (policies: {', '.join(known)})")
    return tuple(Arm(n, n, registry.comparison_flags(n, given), {}) for n in names)


def run_regime(
    regime: Regime,
    arms: Sequence[Arm] | None = None,
    costs: RoundCosts | None = None,
    num_requests: int | None = None,
    seed: int = 0,
    slo: Slo | None = None,
) -> list[ArmRun]:
    """Every arm (default: the regime's) on the same requests; ``slo`` overrides the
    regime's."""
    slo = slo or regime.slo
    arrivals = regime.arrivals(num_requests, seed)
    engine = {"enable_prefix_caching": False, **regime.engine}
    base = SimSpec(
        ServerArgs(dp_size=regime.dp_size, **engine),
        arrivals,
        costs or PRESETS[regime.costs],
        RouterSpec(regime.router),
        seed=seed,
        concurrency=regime.concurrency,
        keep_timeline=True,  # the regime report reads every round
        itl_slo_ms=slo.itl_ms,
    )
    chunk = base.args.max_scheduled_tokens
    runs = []
    for arm in arms or regime.arms:
        result = simulate(base.with_policy(arm.policy, dict(arm.flags)))
        result = replace(result, policy=arm.label)
        runs.append(
            ArmRun(arm.label, summarize(result), goodput(result, slo), regime_report(result, chunk))
        )
    return runs


def run(ns: argparse.Namespace, costs: RoundCosts | None, base: str) -> int:
    """The regime ``ns.scenario``: its arms' table, goodput and regime reports."""
    regime = REGIMES[ns.scenario]
    slo = Slo(
        regime.slo.ttft_ms if ns.slo_ttft_ms is None else ns.slo_ttft_ms,
        regime.slo.itl_ms if ns.slo_itl_ms is None else ns.slo_itl_ms,
    )
    arms = regime_arms(regime, ns.compare, vars(ns))
    runs = run_regime(regime, arms, costs, ns.scenario_requests, ns.seed, slo)
    print(f"{ns.scenario}: {regime.source}; costs {base}{' with overrides' if costs else ''}")
    print(f"why: {regime.why}")
    requests = ns.scenario_requests or regime.num_requests
    loop = f"closed loop of {regime.concurrency}" if regime.concurrency else "open loop"
    print(f"run: {requests} requests, dp {regime.dp_size}, {loop}, seed {ns.seed}")
    baseline = "none" if any(r.label == "none" for r in runs) else None
    print(format_table([r.summary for r in runs], baseline=baseline))
    print(format_goodputs({r.label: r.goodput for r in runs}, baseline))
    print("regime:")
    print(format_reports({r.label: r.regime for r in runs}))
    if ns.json is not None:
        report = {
            "scenario": ns.scenario,
            "source": regime.source,
            "requests": requests,
            "seed": ns.seed,
            "slo": {"ttft_ms": slo.ttft_ms, "itl_ms": slo.itl_ms},
            "results": {
                r.label: r.summary | {"goodput": r.goodput.as_dict(), "regime": r.regime.as_dict()}
                for r in runs
            },
        }
        ns.json.parent.mkdir(parents=True, exist_ok=True)
        ns.json.write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
    return 0
