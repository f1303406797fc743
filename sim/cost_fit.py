"""Round costs fitted to what a deployment's group rounds measured.

A scrape of the engine holds, per kind of busy group round (``decode``: nobody extends;
``extend``: some rank extends a prompt), the number of rounds and their summed wall time
(``roundgate_group_round_duration_seconds``), and the summed work of the busiest rank in them
(``roundgate_group_round_work_total{quantity=decodes|prefill_tokens}``). Each (scrape, kind)
is one equation of the simulator's round price averaged over those rounds:

    mean round = decode_base + decode_per_seq * mean decodes
                 + prefill_per_token * mean prefill tokens + extend_overhead * [extend]

Several scrapes of different loads (below and past saturation, gated and ungated) put the
means at different batch sizes and prompt loads, which is what separates the four terms; the
fit is a non-negative least squares over the equations, weighted by their round counts. With
fewer equations than that, or scrapes without the work counters, the price is the measured
mean decode round plus the measured extend-round difference (two numbers, nothing fitted).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
from prometheus_client.parser import text_string_to_metric_families

GROUP_ROUND = "roundgate_group_round_duration_seconds"
GROUP_WORK = "roundgate_group_round_work"
KINDS = ("decode", "extend")
TOTALS = ("rounds", "seconds", "decodes", "prefill_tokens")  # KindTotals' summed fields
FITTED = ("decode_base_ms", "decode_per_seq_ms", "prefill_per_token_ms", "extend_overhead_ms")


@dataclass(frozen=True)
class KindTotals:
    """One kind of busy group round in one scrape: how many, how long, what they carried."""

    rounds: float = 0.0
    seconds: float = 0.0
    decodes: float = 0.0
    prefill_tokens: float = 0.0
    has_work: bool = False

    def plus(self, other: KindTotals, sign: float = 1.0) -> KindTotals:
        """These totals with ``sign`` times ``other``'s added (``has_work`` stays this one's)."""
        return KindTotals(
            self.rounds + sign * other.rounds,
            self.seconds + sign * other.seconds,
            self.decodes + sign * other.decodes,
            self.prefill_tokens + sign * other.prefill_tokens,
            self.has_work,
        )

    def minus(self, base: KindTotals) -> KindTotals:
        return self.plus(base, -1.0)


def group_totals(scrape: str, flag: str = "--metrics") -> dict[str, dict[str, KindTotals]]:
    """Per DP group (its ``group`` label) and kind, the totals of one Prometheus text scrape."""
    acc: dict[str, dict[str, dict[str, float]]] = {}
    has_work = False
    try:
        families = list(text_string_to_metric_families(scrape))
    except ValueError as exc:
        raise ValueError(f"{flag}: not a Prometheus text scrape ({exc})") from exc
    for family in families:
        if family.name not in (GROUP_ROUND, GROUP_WORK):
            continue
        for sample in family.samples:
            kind = sample.labels.get("kind")
            if kind not in KINDS:
                continue
            group = acc.setdefault(sample.labels.get("group", ""), {})
            totals = group.setdefault(kind, dict.fromkeys(TOTALS, 0.0))
            if family.name == GROUP_WORK:
                quantity = sample.labels.get("quantity")
                if sample.name.endswith("_total") and quantity in ("decodes", "prefill_tokens"):
                    totals[quantity] += sample.value
                    has_work = True
            elif sample.name.endswith("_sum"):
                totals["seconds"] += sample.value
            elif sample.name.endswith("_count"):
                totals["rounds"] += sample.value
    return {
        g: {k: KindTotals(**kinds.get(k, {}), has_work=has_work) for k in KINDS}
        for g, kinds in acc.items()
    }


def kind_totals(scrape: str, baseline: str | None = None) -> dict[str, KindTotals]:
    """Per kind totals of one scrape, summed over its DP groups, less what each group had in
    ``baseline`` (an earlier scrape of the same deployment). Only groups the scrape holds
    count: a replaced group's series may linger in the baseline and then vanish."""
    now = group_totals(scrape)
    before = group_totals(baseline, "--metrics-baseline") if baseline is not None else {}
    out = {k: KindTotals(has_work=any(g[k].has_work for g in now.values())) for k in KINDS}
    for name, kinds in now.items():
        for kind, totals in kinds.items():
            earlier = before.get(name, {}).get(kind)
            diff = totals if earlier is None else totals.minus(earlier)
            if diff.rounds < 0:
                raise ValueError(
                    f"--metrics-baseline: group {name} has more {kind} rounds than in --metrics "
                    "(not a scrape of the same deployment taken before it)"
                )
            out[kind] = out[kind].plus(diff)
    return out


def _equations(runs: list[dict[str, KindTotals]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rows, means, weights = [], [], []
    for run in runs:
        for kind in KINDS:
            t = run[kind]
            if t.rounds < 1:
                continue
            n = t.rounds
            rows.append([1.0, t.decodes / n, t.prefill_tokens / n, float(kind == "extend")])
            means.append(1000.0 * t.seconds / n)
            weights.append(np.sqrt(n))
    return np.array(rows), np.array(means), np.array(weights)


def _nnls(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Least squares with every coefficient >= 0: the best of the unconstrained solutions on
    each subset of the (four) terms that comes out non-negative."""
    best, best_err = np.zeros(a.shape[1]), float(np.sum(b**2))
    for size in range(1, a.shape[1] + 1):
        for subset in itertools.combinations(range(a.shape[1]), size):
            cols = list(subset)
            x_sub, *_ = np.linalg.lstsq(a[:, cols], b, rcond=None)
            if np.any(x_sub < 0):
                continue
            x = np.zeros(a.shape[1])
            x[cols] = x_sub
            err = float(np.sum((a @ x - b) ** 2))
            if err < best_err - 1e-12:
                best, best_err = x, err
    return best


def fit_round_costs(runs: list[dict[str, KindTotals]]) -> tuple[dict[str, float], dict]:
    """The ``--costs`` fields and how they were found, from one or more scrapes' totals."""
    for kind in KINDS:
        if sum(run[kind].rounds for run in runs) < 1:
            raise ValueError(
                f"--metrics: no {kind} rounds in {GROUP_ROUND} (scrape a group that ran both)"
            )
    a, b, w = _equations(runs)
    pooled = {k: _pooled_mean_ms(runs, k) for k in KINDS}
    source: dict = {"decode_round_ms": round(pooled["decode"], 4)}
    source["extend_round_ms"] = round(pooled["extend"], 4)
    source["decode_rounds"] = int(sum(run["decode"].rounds for run in runs))
    source["extend_rounds"] = int(sum(run["extend"].rounds for run in runs))
    if all(run["decode"].has_work for run in runs) and len(b) >= len(FITTED) + 1:
        x = _nnls(a * w[:, None], b * w)
        residual = a @ x - b
        source["fit"] = "nnls over (scrape, kind) means"
        source["equations"] = len(b)
        source["max_abs_residual_ms"] = round(float(np.max(np.abs(residual))), 4)
        costs = {name: round(float(v), 6) for name, v in zip(FITTED, x, strict=True)}
    else:
        source["fit"] = "two means (too few scrapes with work counters for a fit)"
        costs = {
            "decode_base_ms": round(pooled["decode"], 4),
            "decode_per_seq_ms": 0.0,
            "prefill_per_token_ms": 0.0,
            "extend_overhead_ms": round(max(0.0, pooled["extend"] - pooled["decode"]), 4),
        }
    return {**costs, "decode_per_kv_token_ms": 0.0}, source


def _pooled_mean_ms(runs: list[dict[str, KindTotals]], kind: str) -> float:
    rounds = sum(run[kind].rounds for run in runs)
    return 1000.0 * sum(run[kind].seconds for run in runs) / rounds if rounds else 0.0
