"""The regime, live: the served group's ``/metrics`` count every round's gate outcome once,
its mixed rounds and windows, each rank's prefill progress and the group's progress spread,
consistently with the rounds the group reports (gate/outcome.py's readings).

The local deployment (dp=2, the fixed gate at 4/16) gets a skewed workload, then a balanced
one. The group pauses when idle, so its numbers settle; the hub may hold a snapshot taken
mid-round until the next push, so every read polls until the numbers hold still and agree.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import httpx
from helpers import BackgroundStream, complete, wait_for
from prometheus_client.parser import text_string_to_metric_families

from roundgate.gate.outcome import CLOSED, EMPTY, NO_DEMAND, OUTCOMES, PARTIAL

GROUP_SERIES = (
    "roundgate_group_rounds_total",
    "roundgate_prefill_rounds_total",
    "roundgate_mixed_rounds_total",
    "roundgate_prefill_windows_total",
    "roundgate_prefill_progress_spread_chunks",
    "roundgate_prefill_progress_bins_total",
    "roundgate_prefill_progress_bin_spread_chunks_total",
)


def scrape(url: str) -> dict[str, dict[str, Any]]:
    """Per group: its group series, outcomes, admitted windows and ranks' prefill tokens;
    ``counts`` holds how many series each group name had (each must be exported once)."""
    text = httpx.get(f"{url}/metrics", timeout=30).raise_for_status().text
    groups: dict[str, dict[str, Any]] = defaultdict(
        lambda: {"outcomes": {}, "admitted": {}, "rank_tokens": {}, "counts": defaultdict(int)}
    )
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if "group" not in s.labels:
                continue
            g = groups[s.labels["group"]]
            if s.name in GROUP_SERIES:
                g[s.name] = s.value
                g["counts"][s.name] += 1
            elif s.name == "roundgate_gate_rounds_total":
                g["outcomes"][s.labels["outcome"]] = s.value
            elif s.name == "roundgate_gate_windows_admitted_total":
                g["admitted"][s.labels["point"]] = s.value
            elif s.name == "roundgate_rank_prefill_tokens_total":
                g["rank_tokens"][s.labels["dp_rank"]] = s.value
    return {name: g for name, g in groups.items() if "roundgate_group_rounds_total" in g}


def problems(group: dict[str, Any]) -> list[str]:
    """What is inconsistent in one group's scrape (empty: all agree)."""
    out = []
    outcomes, rounds = group["outcomes"], group["roundgate_group_rounds_total"]
    prefill = group["roundgate_prefill_rounds_total"]
    if not set(OUTCOMES) <= outcomes.keys():
        out.append(f"outcomes {sorted(outcomes)} lack some of {OUTCOMES}")
    if sum(outcomes.values()) != rounds:
        out.append(f"outcomes sum to {sum(outcomes.values())}, group rounds {rounds}")
    ran = sum(v for o, v in outcomes.items() if o not in (CLOSED, EMPTY, NO_DEMAND))
    if ran != prefill:
        out.append(f"openings that ran + partial = {ran}, prefill rounds {prefill}")
    for point in ("all", "any"):  # the fixed gate: an opening that ran is an admitted window
        if outcomes.get(point) != group["admitted"].get(point):
            out.append(f"{point}: {outcomes.get(point)} vs admitted {group['admitted']}")
    if not group["roundgate_mixed_rounds_total"] <= prefill:
        out.append("more mixed rounds than prefill rounds")
    if not group["roundgate_prefill_windows_total"] <= prefill:
        out.append("more windows than prefill rounds")
    return out


def settled(url: str) -> dict[str, dict[str, Any]]:
    """A scrape whose groups agree with themselves and with the scrape before it."""
    previous: dict[str, Any] = {}

    def probe() -> dict[str, Any]:
        now = scrape(url)
        seen = {
            "groups": now,
            "problems": {name: problems(g) for name, g in now.items()},
            "same": bool(now) and now == previous.get("groups"),
        }
        previous["groups"] = now
        return seen

    def ok(seen: dict[str, Any]) -> bool:
        return seen["same"] and not any(seen["problems"].values())

    # The hub keeps a rank's last push; a quiet rank re-pushes every KEEPALIVE_S (10 s).
    return wait_for(probe, 45, "settled, self-consistent regime series", until=ok, interval_s=1.5)[
        "groups"
    ]


def test_gate_outcomes_mixed_rounds_and_progress_move_consistently(app) -> None:
    complete(app.url, prompt="warm", max_tokens=2)
    before = settled(app.url)
    decoder = BackgroundStream(
        app.url, prompt=[5, 6, 7], max_tokens=3000, ignore_eos=True, dp_rank=1
    )
    try:
        assert decoder.started.wait(60)
        # A backlog on rank 0 while rank 1 decodes: held (closed) until an ANY point opens
        # it, and then rank 0 extends while rank 1 only decodes (mixed rounds).
        for i in range(4):
            complete(app.url, prompt=f"skewed prompt number {i}", max_tokens=2, dp_rank=0)
    finally:
        decoder.close()
    for i in range(4):  # both ranks idle or wanting: ALL points open
        complete(app.url, prompt=f"balanced prompt number {i}", max_tokens=2, dp_rank=i % 2)
    after = settled(app.url)

    # The serving gang's group moved; a gang redeployed by an earlier test may linger a while.
    served = {
        name: group
        for name, group in after.items()
        if name in before
        and group["roundgate_group_rounds_total"] > before[name]["roundgate_group_rounds_total"]
    }
    assert served, (before, after)
    for name, group in served.items():
        # One series per group: rank 0 exports the group's figures, no rank doubles them.
        assert all(group["counts"][s] == 1 for s in GROUP_SERIES), (name, group["counts"])
        assert group["roundgate_prefill_progress_spread_chunks"] >= 0
        assert set(group["rank_tokens"]) == {"0", "1"}, group["rank_tokens"]
        assert group["outcomes"][PARTIAL] == 0  # the fixed gate holds resident chunks too
        old = before[name]
        grew = {o: group["outcomes"][o] - old["outcomes"][o] for o in (CLOSED, "all", "any")}
        for series in ("roundgate_mixed_rounds_total", "roundgate_prefill_windows_total"):
            grew[series] = group[series] - old[series]
        for rank in ("0", "1"):
            grew[f"rank {rank} prefill tokens"] = group["rank_tokens"][rank] - old[
                "rank_tokens"
            ].get(rank, 0.0)
        assert all(v > 0 for v in grew.values()), grew
