"""Summaries of a live bench run: percentiles, throughput, goodput under an SLO, errors."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from roundgate.bench.client import RequestResult
from roundgate.sim.goodput import count_slow, meets_itl_p99
from roundgate.sim.report import percentiles


def summarize(
    results: Sequence[RequestResult], duration_s: float, slo_ttft_ms: float, slo_itl_ms: float
) -> dict[str, Any]:
    ok = [r for r in results if r.ok]
    ttft = [r.ttft_s * 1000 for r in ok if r.ttft_s is not None]
    itl = [g * 1000 for r in ok for g in r.chunk_gaps_s]
    tpot = [
        (r.e2e_s - r.ttft_s) * 1000 / (r.output_tokens - 1)
        for r in ok
        if r.ttft_s is not None and r.output_tokens > 1
    ]
    e2e = [r.e2e_s * 1000 for r in ok]
    # Good: TTFT within its bound and the request's own ITL p99 within its bound, judged as
    # the simulator judges its requests (sim/goodput.py), so live and simulated goodput agree.
    good = [
        r
        for r in ok
        if r.ttft_s is not None
        and r.ttft_s * 1000 <= slo_ttft_ms
        and meets_itl_p99(
            count_slow((g * 1000 for g in r.chunk_gaps_s), slo_itl_ms), len(r.chunk_gaps_s)
        )
    ]
    out_tokens = sum(r.output_tokens for r in ok)
    # Sessions: a first turn prefills the shared prompt at most; later turns resend context.
    first = [r.ttft_s * 1000 for r in ok if r.ttft_s is not None and r.turn == 0]
    later = [r.ttft_s * 1000 for r in ok if r.ttft_s is not None and r.turn > 0]
    errors: dict[str, int] = {}
    for r in results:
        if r.error:
            key = r.error.split(":")[0]
            errors[key] = errors.get(key, 0) + 1
    return {
        "requests": len(results),
        "completed": len(ok),
        "errors": errors,
        "duration_s": round(duration_s, 3),
        "request_throughput": round(len(ok) / duration_s, 3) if duration_s else 0.0,
        "output_tokens_per_s": round(out_tokens / duration_s, 2) if duration_s else 0.0,
        "ttft_ms": percentiles(ttft),
        "itl_ms": percentiles(itl),
        "tpot_ms": percentiles(tpot),
        "e2e_ms": percentiles(e2e),
        "slo": {"ttft_ms": slo_ttft_ms, "itl_ms": slo_itl_ms, "itl_statistic": "p99"},
        "goodput_requests_per_s": round(len(good) / duration_s, 3) if duration_s else 0.0,
        "goodput_fraction": round(len(good) / len(results), 4) if results else 0.0,
        "ttft_first_turn_ms": percentiles(first),
        "ttft_later_turns_ms": percentiles(later),
    }


COLUMNS = (
    ("run", ("run",), "{}"),
    ("done", ("completed",), "{}"),
    ("err", ("error_count",), "{}"),
    ("req/s", ("request_throughput",), "{:.2f}"),
    ("out tok/s", ("output_tokens_per_s",), "{:.1f}"),
    ("TTFT p50", ("ttft_ms", "p50"), "{:.1f}"),
    ("TTFT p99", ("ttft_ms", "p99"), "{:.1f}"),
    ("ITL p50", ("itl_ms", "p50"), "{:.1f}"),
    ("ITL p99", ("itl_ms", "p99"), "{:.1f}"),
    ("e2e p99", ("e2e_ms", "p99"), "{:.0f}"),
    ("goodput req/s", ("goodput_requests_per_s",), "{:.3f}"),
    ("good %", ("goodput_fraction",), "{:.1%}"),
    ("TTFT p50 turn>1", ("ttft_later_turns_ms", "p50"), "{:.1f}"),
    ("hit rate", ("prefix_hit_rate",), "{:.1%}"),
)


def format_table(named: Sequence[tuple[str, dict[str, Any]]]) -> str:
    rows = [[c[0] for c in COLUMNS]]
    for name, s in named:
        s = {"prefix_hit_rate": None, **s, "run": name, "error_count": sum(s["errors"].values())}
        cells = []
        for _, path, fmt in COLUMNS:
            value: Any = s
            for key in path:
                value = value[key]
            cells.append("-" if value is None else fmt.format(value))
        rows.append(cells)
    widths = [max(len(r[i]) for r in rows) for i in range(len(COLUMNS))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows)


def write_plots(named: Sequence[tuple[str, Sequence[RequestResult]]], out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for metric in ("ttft", "itl", "e2e"):
        fig, ax = plt.subplots(figsize=(6, 4))
        for name, results in named:
            ok = [r for r in results if r.ok]
            if metric == "ttft":
                data = [r.ttft_s * 1000 for r in ok if r.ttft_s is not None]
            elif metric == "itl":
                data = [g * 1000 for r in ok for g in r.chunk_gaps_s]
            else:
                data = [r.e2e_s * 1000 for r in ok]
            if data:
                xs = np.sort(np.asarray(data))
                ax.plot(xs, np.arange(1, xs.size + 1) / xs.size, label=name)
        ax.set_xscale("log")
        ax.set_xlabel(f"{metric.upper()} (ms)")
        ax.set_ylabel("CDF")
        ax.legend()
        fig.tight_layout()
        path = out / f"bench_{metric}_cdf.png"
        fig.savefig(path, dpi=90)
        plt.close(fig)
        paths.append(path)
    return paths
