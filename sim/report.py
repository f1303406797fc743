"""Summaries of simulator runs: the metrics dict (JSON), the terminal table, and the plots."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from roundgate.sim import plots
from roundgate.sim.records import SimResult

PERCENTILES = (50, 90, 99)


def percentiles(values: Sequence[float] | np.ndarray) -> dict[str, float | None]:
    """p50/p90/p99 in the values' unit, ``None`` when there is nothing to measure."""
    data = np.asarray(values, dtype=float)
    if data.size == 0:
        return {f"p{p}": None for p in PERCENTILES}
    return {f"p{p}": round(float(np.percentile(data, p)), 4) for p in PERCENTILES}


def distribution(values: Sequence[float] | np.ndarray) -> dict[str, float | None]:
    """mean, p50, p90 and p99 (what serving benchmarks publish), ``None`` when empty."""
    data = np.asarray(values, dtype=float)
    mean = round(float(data.mean()), 4) if data.size else None
    return {"mean": mean, **percentiles(data)}


def tpots_ms(result: SimResult) -> list[float]:
    """Each request's time per output token after the first (vLLM's TPOT; needs >= 2)."""
    return [
        (r.last_token_s - r.first_token_s) * 1000 / (r.num_output - 1)
        for r in result.records
        if r.num_output > 1 and r.first_token_s is not None and r.last_token_s is not None
    ]


def summarize(result: SimResult) -> dict[str, Any]:
    """The metrics of one run, JSON-ready and deterministic for a seeded workload."""
    recs = result.records
    ttft = [(r.first_token_s - r.arrival_s) * 1000 for r in recs if r.first_token_s is not None]
    e2e = [(r.finish_s - r.arrival_s) * 1000 for r in recs if r.finish_s is not None]
    waits = [r.admission_wait for r in recs if r.admission_wait is not None]
    later = [
        (r.first_token_s - r.arrival_s) * 1000
        for r in recs
        if r.first_token_s is not None and r.turn > 0
    ]
    output_tokens = sum(r.num_output for r in recs)
    return {
        "policy": result.policy,
        "dp_size": result.dp_size,
        "requests": len(recs),
        "unfinished": result.unfinished,
        "rounds": result.rounds,
        "busy_rounds": result.busy_rounds,
        "prefill_rounds": result.prefill_rounds,
        "decode_rounds": result.decode_rounds,
        "decode_round_fraction": round(result.decode_rounds / max(1, result.busy_rounds), 6),
        "duration_s": round(result.duration_s, 6),
        "output_tokens": output_tokens,
        "output_tokens_per_s": round(output_tokens / result.duration_s, 3)
        if result.duration_s
        else 0.0,
        "requests_per_s": round(len(e2e) / result.duration_s, 4) if result.duration_s else 0.0,
        "ttft_ms": distribution(ttft),
        "itl_ms": distribution(result.itl_ms),
        "tpot_ms": distribution(tpots_ms(result)),
        "e2e_ms": distribution(e2e),
        "max_admission_wait_rounds": max(waits, default=None),
        # Prompt tokens whose K/V came from a rank's prefix cache, over all prompt tokens.
        "prefix_hit_rate": round(result.prefix_hits / result.prefix_queries, 4)
        if result.prefix_queries
        else 0.0,
        "ttft_later_turns_ms": percentiles(later),  # sessions: turns after the first
        "collections": result.collections,  # stop-the-world collections (RoundCosts)
    } | ({} if result.experts is None else {"experts": asdict(result.experts)})


TABLE_COLUMNS = (
    ("policy", "policy", "{}"),
    ("decode frac", "decode_round_fraction", "{:.3f}"),
    ("out tok/s", "output_tokens_per_s", "{:.0f}"),
    ("TTFT p50 ms", ("ttft_ms", "p50"), "{:.1f}"),
    ("TTFT p99 ms", ("ttft_ms", "p99"), "{:.1f}"),
    ("ITL p50 ms", ("itl_ms", "p50"), "{:.2f}"),
    ("ITL p99 ms", ("itl_ms", "p99"), "{:.2f}"),
    ("adm wait max", "max_admission_wait_rounds", "{}"),
    ("hit rate", "prefix_hit_rate", "{:.3f}"),
)


def _get(summary: dict[str, Any], key: str | tuple[str, str]) -> Any:
    if isinstance(key, tuple):
        return summary[key[0]][key[1]]
    return summary[key]


def format_table(summaries: Sequence[dict[str, Any]], baseline: str | None = "none") -> str:
    """A fixed-width table; with a ``baseline`` run present, each number gets its ratio."""
    base = next((s for s in summaries if s["policy"] == baseline), None)
    header = [name for name, _, _ in TABLE_COLUMNS]
    lines = [header]
    for s in summaries:
        cells = []
        for _, key, fmt in TABLE_COLUMNS:
            value = _get(s, key)
            text = "-" if value is None else fmt.format(value)
            if base is not None and key != "policy" and s is not base and value is not None:
                ref = _get(base, key)
                if isinstance(ref, int | float) and ref:
                    text += f" ({value / ref:.2f}x)"
            cells.append(text)
        lines.append(cells)
    widths = [max(len(row[i]) for row in lines) for i in range(len(header))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in lines
    )


# The metrics the comparison reports as ratios to a baseline policy.
RATIO_METRICS = (
    ("decode_round_fraction", "decode frac"),
    ("output_tokens_per_s", "out tok/s"),
    (("ttft_ms", "p50"), "TTFT p50"),
    (("ttft_ms", "p99"), "TTFT p99"),
    (("itl_ms", "p50"), "ITL p50"),
    (("itl_ms", "p99"), "ITL p99"),
    ("max_admission_wait_rounds", "adm wait max"),
)


def metric_name(key: str | tuple[str, str]) -> str:
    return key if isinstance(key, str) else f"{key[0]}_{key[1]}"


def ratios_to(
    summaries: Sequence[dict[str, Any]], baseline: str = "none"
) -> dict[str, dict[str, float | None]]:
    """Each policy's metrics divided by the baseline's (None where either is missing or 0)."""
    base = next((s for s in summaries if s["policy"] == baseline), None)
    if base is None:
        return {}
    out: dict[str, dict[str, float | None]] = {}
    for s in summaries:
        row: dict[str, float | None] = {}
        for key, _ in RATIO_METRICS:
            value, ref = _get(s, key), _get(base, key)
            ok = isinstance(value, int | float) and isinstance(ref, int | float) and ref
            row[metric_name(key)] = round(value / ref, 4) if ok else None
        out[s["policy"]] = row
    return out


def write_plots(
    results: Sequence[SimResult],
    out_dir: Path,
    summaries: Sequence[dict[str, Any]] | None = None,
    max_rounds: int = 400,
) -> list[Path]:
    """Per-policy rank timelines, TTFT/ITL CDFs and, with a ``none`` run among several, a bar
    chart of every policy's ratio to it per metric."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [plots.timeline(res, out_dir, max_rounds) for res in results]
    paths = [p for p in paths if p is not None]
    paths += plots.cdfs(results, out_dir)
    summaries = summaries if summaries is not None else [summarize(r) for r in results]
    ratios = ratios_to(summaries, "none")
    if len(summaries) > 1 and ratios:
        labels = [label for _, label in RATIO_METRICS]
        keys = [metric_name(key) for key, _ in RATIO_METRICS]
        table = {p: [row[k] for k in keys] for p, row in ratios.items() if p != "none"}
        paths.append(plots.ratio_bars(table, labels, out_dir / "ratios.png"))
    return paths
