"""Summaries of simulator runs: the metrics dict (JSON), the terminal table, and the plots."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from deployment.sim.simulator import SimResult

PERCENTILES = (50, 90, 99)


def percentiles(values: Sequence[float] | np.ndarray) -> dict[str, float | None]:
    """p50/p90/p99 in the values' unit, ``None`` when there is nothing to measure."""
    data = np.asarray(values, dtype=float)
    if data.size == 0:
        return {f"p{p}": None for p in PERCENTILES}
    return {f"p{p}": round(float(np.percentile(data, p)), 4) for p in PERCENTILES}


def summarize(result: SimResult) -> dict[str, Any]:
    """The metrics of one run, JSON-ready and deterministic for a seeded workload."""
    recs = result.records
    ttft = [(r.first_token_s - r.arrival_s) * 1000 for r in recs if r.first_token_s is not None]
    e2e = [(r.finish_s - r.arrival_s) * 1000 for r in recs if r.finish_s is not None]
    waits = [r.admission_wait for r in recs if r.admission_wait is not None]
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
        "ttft_ms": percentiles(ttft),
        "itl_ms": percentiles(result.itl_ms),
        "e2e_ms": percentiles(e2e),
        "max_admission_wait_rounds": max(waits, default=None),
    }


TABLE_COLUMNS = (
    ("policy", "policy", "{}"),
    ("decode frac", "decode_round_fraction", "{:.3f}"),
    ("out tok/s", "output_tokens_per_s", "{:.0f}"),
    ("TTFT p50 ms", ("ttft_ms", "p50"), "{:.1f}"),
    ("TTFT p99 ms", ("ttft_ms", "p99"), "{:.1f}"),
    ("ITL p50 ms", ("itl_ms", "p50"), "{:.2f}"),
    ("ITL p99 ms", ("itl_ms", "p99"), "{:.2f}"),
    ("adm wait max", "max_admission_wait_rounds", "{}"),
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


def write_plots(results: Sequence[SimResult], out_dir: Path, max_rounds: int = 400) -> list[Path]:
    """Per-policy rank timelines (first ``max_rounds`` busy rounds) and TTFT/ITL CDFs."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import ListedColormap

    out_dir.mkdir(parents=True, exist_ok=True)
    paths: list[Path] = []
    cmap = ListedColormap(["#eeeeee", "#4c72b0", "#dd8452", "#c44e52"])
    for res in results:
        tl = res.timeline
        if tl is None or not tl.points:
            continue
        n = min(len(tl.points), max_rounds)
        grid = np.frombuffer(bytes(tl.kinds[: n * res.dp_size]), dtype=np.uint8)
        grid = grid.reshape(n, res.dp_size).T
        fig, ax = plt.subplots(figsize=(12, 1 + 0.4 * res.dp_size))
        ax.imshow(grid, aspect="auto", cmap=cmap, vmin=0, vmax=3, interpolation="nearest")
        for i in range(n):
            if tl.opened[i] and tl.points[i]:
                ax.axvline(i, color="black" if tl.points[i] == 1 else "red", lw=0.6, alpha=0.7)
        ax.set_xlabel(
            "round (grey idle, blue decode, orange prefill, red mixed; "
            "lines: gate opened at ALL (black) / ANY (red))"
        )
        ax.set_ylabel("dp rank")
        ax.set_title(f"{res.policy}: per-rank rounds")
        path = out_dir / f"timeline_{res.policy}.png"
        fig.tight_layout()
        fig.savefig(path, dpi=100)
        plt.close(fig)
        paths.append(path)
    for metric in ("ttft", "itl"):
        fig, ax = plt.subplots(figsize=(6, 4))
        for res in results:
            if metric == "ttft":
                data = [
                    (r.first_token_s - r.arrival_s) * 1000
                    for r in res.records
                    if r.first_token_s is not None
                ]
            else:
                data = list(res.itl_ms)
            if data:
                xs = np.sort(np.asarray(data))
                ax.plot(xs, np.arange(1, xs.size + 1) / xs.size, label=res.policy)
        ax.set_xscale("log")
        ax.set_xlabel(f"{metric.upper()} (ms)")
        ax.set_ylabel("CDF")
        ax.legend()
        path = out_dir / f"{metric}_cdf.png"
        fig.tight_layout()
        fig.savefig(path, dpi=100)
        plt.close(fig)
        paths.append(path)
    return paths
