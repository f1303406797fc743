"""The simulator's PNGs: per-rank timelines, TTFT/ITL CDFs, and ratio bars against a baseline.

Drawing only; ``roundgate.sim.report.write_plots`` decides what to draw. Figures are sized and
rendered at 100 dpi so each file stays well under 200 KB (they are committed under docs/).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from roundgate.sim.records import SimResult

KIND_COLORS = ["#eeeeee", "#4c72b0", "#dd8452", "#c44e52"]  # idle, decode, prefill, mixed


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def timeline(res: SimResult, out_dir: Path, max_rounds: int = 400) -> Path | None:
    """One row per rank over the first ``max_rounds`` rounds; gate openings as lines."""
    from matplotlib.colors import ListedColormap

    tl = res.timeline
    if tl is None or not tl.points:
        return None
    plt = _pyplot()
    n = min(len(tl.points), max_rounds)
    grid = np.frombuffer(bytes(tl.kinds[: n * res.dp_size]), dtype=np.uint8)
    grid = grid.reshape(n, res.dp_size).T
    fig, ax = plt.subplots(figsize=(12, 1 + 0.4 * res.dp_size))
    ax.imshow(
        grid,
        aspect="auto",
        cmap=ListedColormap(KIND_COLORS),
        vmin=0,
        vmax=3,
        interpolation="nearest",
    )
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
    return path


def _ttft_ms(res: SimResult) -> list[float]:
    return [
        (r.first_token_s - r.arrival_s) * 1000 for r in res.records if r.first_token_s is not None
    ]


def cdfs(results: Sequence[SimResult], out_dir: Path) -> list[Path]:
    """TTFT and ITL CDFs, one line per policy, log-scaled milliseconds."""
    plt = _pyplot()
    paths = []
    for metric in ("ttft", "itl"):
        fig, ax = plt.subplots(figsize=(6, 4))
        for res in results:
            data = _ttft_ms(res) if metric == "ttft" else list(res.itl_ms)
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


def ratio_bars(
    ratios: Mapping[str, Sequence[float | None]], labels: Sequence[str], path: Path
) -> Path:
    """Grouped bars: per metric, each policy's ratio to the baseline (log scale, 1 = equal)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(10, 4))
    width = 0.8 / max(1, len(ratios))
    xs = np.arange(len(labels))
    for i, (policy, values) in enumerate(ratios.items()):
        heights = [v if v else np.nan for v in values]
        ax.bar(xs + (i - (len(ratios) - 1) / 2) * width, heights, width, label=policy)
    ax.axhline(1.0, color="black", lw=0.8)
    ax.set_yscale("log")
    ax.set_xticks(xs, labels)
    ax.set_ylabel("ratio to none (log)")
    ax.set_title("each policy against no gate (higher is better for decode frac and tok/s)")
    ax.legend(fontsize="small", ncol=3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def steady_state(reports: Mapping[str, Mapping], path: Path, title: str) -> Path:
    """Per arm over the run: requests sent and finished per second, the requests in the
    system and waiting for a first token, and the ITL median; the steady window shaded."""
    plt = _pyplot()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig, axes = plt.subplots(3, 1, figsize=(9, 7), sharex=True)
    for i, (label, report) in enumerate(reports.items()):
        s, color = report["series"], f"C{i}"
        axes[0].plot(s["t_s"], s["finished_rps"], color=color, label=f"{label}: finished")
        axes[0].plot(s["t_s"], s["sent_rps"], color=color, ls=":", label=f"{label}: sent")
        axes[1].plot(s["t_s"], s["in_system"], color=color, label=f"{label}: in system")
        axes[1].plot(s["t_s"], s["waiting"], color=color, ls=":", label=f"{label}: waiting")
        itl = [np.nan if v is None else v for v in s["itl_p50_ms"]]
        axes[2].plot(s["t_s"], itl, color=color, label=label)
        window = report["window"]
        if window is not None:
            for ax in axes:
                ax.axvspan(window["start_s"], window["end_s"], color=color, alpha=0.06)
    axes[0].set_ylabel("requests/s")
    axes[1].set_ylabel("requests")
    axes[2].set_ylabel("ITL p50 per bin (ms)")
    axes[2].set_yscale("log")
    axes[2].set_xlabel("simulated time (s); shaded: each arm's steady-state window")
    axes[0].set_title(f"{title}: throughput and queue over the run")
    for ax in axes:
        ax.legend(fontsize="x-small", ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
