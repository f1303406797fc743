"""The steady state of a run: its figures over a warm-up-trimmed window, and whether it has one.

A benchmark's figures cover its whole run: the warm-up (an empty engine filling up) and the
drain (decode-only rounds after the last arrival) weigh in by the run's length, and a group
that cannot keep up shows figures that grow with it. The window starts once
``WARMUP_FRACTION`` of the requests have been sent, and not before a median request's whole
life after the first send (a group fills up for that long: Little's law) unless that leaves
less than the later half of the sends, and ends at the last send, so neither end counts;
over it the run is **steady** when the requests in the system do not grow (their
least-squares slope under ``STABLE_GROWTH`` of the offered rate). ``steady_report`` gives the
window, its figures (TTFT and TPOT of the requests sent inside it, ITL of the tokens emitted
inside it, throughput of what finished inside it) and the series over the whole run
(throughput, queue length, ITL median per bin) that the JSON keeps and ``plots.steady_state``
draws.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from roundgate.sim.records import SimResult

WARMUP_FRACTION = 0.2  # the share of the requests sent before the window opens
STABLE_GROWTH = 0.05  # the system may grow by at most this share of the offered rate
NUM_BINS = 60  # series points over the run


@dataclass(frozen=True)
class SteadyWindow:
    """The window and what a queue does over it."""

    start_s: float
    end_s: float
    offered_rps: float  # requests sent per second inside the window
    throughput_rps: float  # requests finished per second inside the window
    queue_growth_rps: float  # slope of the requests in the system (sent, not finished)

    @property
    def steady(self) -> bool:
        return self.queue_growth_rps <= STABLE_GROWTH * self.offered_rps


def _times(result: SimResult) -> dict[str, np.ndarray]:
    recs = result.records
    nan = float("nan")
    return {
        "sent": np.array([r.arrival_s for r in recs]),
        "first": np.array([nan if r.first_token_s is None else r.first_token_s for r in recs]),
        "finish": np.array([nan if r.finish_s is None else r.finish_s for r in recs]),
    }


def itl_times(result: SimResult) -> np.ndarray:
    """When each ITL sample was taken: the clock after the step that recorded it."""
    counts = np.frombuffer(result.step_itl_count, dtype=np.int64)
    ends = np.frombuffer(result.step_end_s, dtype=float)
    index = np.searchsorted(counts, np.arange(len(result.itl_ms)), side="right")
    return ends[np.minimum(index, len(ends) - 1)] if len(ends) else np.zeros(0)


def _count_before(times: np.ndarray, at: np.ndarray) -> np.ndarray:
    done = np.sort(times[~np.isnan(times)])
    return np.searchsorted(done, at, side="right")


def window_of(result: SimResult) -> SteadyWindow | None:
    """The warm-up-trimmed window of a run, None for a run too short to have one."""
    t = _times(result)
    sent = np.sort(t["sent"])
    if len(sent) < 10:
        return None
    lives = t["finish"] - t["sent"]
    life = float(np.nanmedian(lives)) if np.any(~np.isnan(lives)) else 0.0
    start = max(float(sent[int(WARMUP_FRACTION * len(sent))]), float(sent[0]) + life)
    start = min(start, float(sent[len(sent) // 2]))  # at least the later half of the sends
    end = float(sent[-1])
    if end <= start:
        return None
    span = end - start
    offered = float(np.count_nonzero((sent >= start) & (sent <= end))) / span
    finish = t["finish"][~np.isnan(t["finish"])]
    throughput = float(np.count_nonzero((finish >= start) & (finish <= end))) / span
    grid = np.linspace(start, end, 32)
    in_system = _count_before(t["sent"], grid) - _count_before(t["finish"], grid)
    growth = float(np.polyfit(grid, in_system, 1)[0])
    return SteadyWindow(start, end, offered, throughput, growth)


def _distribution(values: np.ndarray) -> dict[str, float | None]:
    if values.size == 0:
        return {"mean": None, "p50": None, "p99": None}
    return {
        "mean": round(float(values.mean()), 4),
        "p50": round(float(np.percentile(values, 50)), 4),
        "p99": round(float(np.percentile(values, 99)), 4),
    }


def window_figures(result: SimResult, window: SteadyWindow) -> dict[str, Any]:
    """The run's figures over the window, keyed as ``roundgate.sim.report.summarize`` keys them."""
    start, end = window.start_s, window.end_s
    recs = [r for r in result.records if start <= r.arrival_s <= end]
    ttft = np.array(
        [(r.first_token_s - r.arrival_s) * 1000 for r in recs if r.first_token_s is not None]
    )
    tpot = np.array(
        [
            (r.last_token_s - r.first_token_s) * 1000 / (r.num_output - 1)
            for r in recs
            if r.num_output > 1 and r.first_token_s is not None and r.last_token_s is not None
        ]
    )
    itl = np.frombuffer(result.itl_ms, dtype=float)
    at = itl_times(result)
    inside = (at >= start) & (at <= end)
    firsts = sum(
        1 for r in result.records if r.first_token_s is not None and start <= r.first_token_s <= end
    )
    span = end - start
    return {
        "requests_per_s": round(window.throughput_rps, 4),
        "output_tokens_per_s": round((int(inside.sum()) + firsts) / span, 3),
        "ttft_ms": _distribution(ttft),
        "itl_ms": _distribution(itl[inside]),
        "tpot_ms": _distribution(tpot),
    }


def series(result: SimResult, num_bins: int = NUM_BINS) -> dict[str, list[float]]:
    """Per bin over the whole run: requests sent and finished per second, output tokens per
    second, the ITL median, and at each bin's end the requests waiting for their first token
    and those in the system."""
    t = _times(result)
    end = max(result.duration_s, 1e-9)
    edges = np.linspace(0.0, end, num_bins + 1)
    width = edges[1] - edges[0]
    itl = np.frombuffer(result.itl_ms, dtype=float)
    at = itl_times(result)

    def rate(times: np.ndarray) -> list[float]:
        counts, _ = np.histogram(times[~np.isnan(times)], bins=edges)
        return [round(float(c) / width, 3) for c in counts]

    tokens, _ = np.histogram(np.concatenate([at, t["first"][~np.isnan(t["first"])]]), edges)
    bins = np.clip(np.searchsorted(edges, at, side="right") - 1, 0, num_bins - 1)
    medians = [
        round(float(np.median(itl[bins == b])), 3) if np.any(bins == b) else None
        for b in range(num_bins)
    ]
    ends = edges[1:]
    sent = _count_before(t["sent"], ends)
    return {
        "t_s": [round(float(x), 3) for x in ends],
        "sent_rps": rate(t["sent"]),
        "finished_rps": rate(t["finish"]),
        "output_tokens_per_s": [round(float(c) / width, 1) for c in tokens],
        "itl_p50_ms": medians,
        "waiting": [int(x) for x in sent - _count_before(t["first"], ends)],
        "in_system": [int(x) for x in sent - _count_before(t["finish"], ends)],
    }


def steady_report(result: SimResult) -> dict[str, Any]:
    """The window (None if the run has none), its figures and the run's series, JSON-ready."""
    window = window_of(result)
    out: dict[str, Any] = {"window": None, "figures": None, "series": series(result)}
    if window is not None:
        out["window"] = {
            **{k: round(v, 4) for k, v in asdict(window).items()},
            "steady": window.steady,
        }
        out["figures"] = window_figures(result, window)
    return out


def describe(report: dict[str, Any]) -> str:
    """One line: the window, offered vs delivered, the queue's growth and the verdict."""
    w = report["window"]
    if w is None:
        return "no steady-state window (too few requests)"
    growth = w["queue_growth_rps"] / w["offered_rps"] if w["offered_rps"] else 0.0
    verdict = "steady" if w["steady"] else f"NOT steady (still growing, {growth:+.0%} of offered)"
    return (
        f"window {w['start_s']:.1f}-{w['end_s']:.1f} s: {w['offered_rps']:.2f} req/s offered, "
        f"{w['throughput_rps']:.2f} finished, in system {w['queue_growth_rps']:+.2f} req/s: "
        f"{verdict}"
    )
