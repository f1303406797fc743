"""Metrics: definitions, the rank recorder, and the hub's merge/render (promtool-clean)."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import replace

import pytest
from builders import make_args, make_loops, make_request
from prometheus_client.parser import text_string_to_metric_families

from roundgate.actors.control.rank_loop import RoundParts
from roundgate.actors.telemetry.metrics import RankMetricSet, RequestMetricSet
from roundgate.actors.telemetry.metrics_hub import merge, render, snapshot
from roundgate.actors.telemetry.rank_metrics import RankMetrics, busiest_work
from roundgate.gate.rows import RankRow

# What each busy round "took" in the recorder's eyes (fixed: the test times nothing).
PARTS = RoundParts(schedule=1e-5, forward=1e-3)
ROUND_S = 0.02  # gather to gather, as the group's clock sees it


def run_group(rounds: int = 40) -> list[RankMetrics]:
    loops = make_loops(make_args(2, num_kv_pages=64))
    recorders = [RankMetrics("g0", "tiny-moe", rank) for rank in range(2)]
    loops[0].scheduler.add_request(make_request("a", prompt_len=10, max_tokens=30, token=1))
    recorders[0].note_arrival("a")
    for i in range(rounds):
        if i == 5:
            loops[1].scheduler.add_request(make_request("b", prompt_len=6, max_tokens=5, token=2))
        rows = [loop.begin() for loop in loops]
        # The group's round boundaries: round i's gather returns at i * ROUND_S.
        parts = replace(PARTS, gathered_at=i * ROUND_S)
        for loop, rec in zip(loops, recorders, strict=True):
            outcome = loop.finish(rows)
            rec.observe(outcome, loop.scheduler, parts, loop.policy.rounds_since_prefill)
    return recorders


def values(text: str) -> dict[tuple[str, tuple], float]:
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_group_series_come_from_rank_zero_only() -> None:
    recorders = run_group()
    text = render(merge(snapshot(r.set.registry) for r in recorders)).decode()
    vals = values(text)
    rounds = vals[("roundgate_group_rounds_total", (("group", "g0"), ("model", "tiny-moe")))]
    assert rounds == 40  # counted once, not once per rank
    prefill = vals[("roundgate_prefill_rounds_total", (("group", "g0"), ("model", "tiny-moe")))]
    decode = vals[("roundgate_decode_rounds_total", (("group", "g0"), ("model", "tiny-moe")))]
    assert prefill >= 2 and decode > 0 and prefill + decode <= rounds
    # Every busy round records its parts (and their total) on every rank; idle rounds do not.
    for rank in ("0", "1"):
        labels = (("dp_rank", rank), ("group", "g0"), ("model", "tiny-moe"))
        assert vals[("roundgate_round_duration_seconds_count", labels)] == prefill + decode
        assert vals[("roundgate_round_duration_seconds_sum", labels)] == pytest.approx(
            (prefill + decode) * PARTS.total
        )
        forward = (("dp_rank", rank), ("group", "g0"), ("model", "tiny-moe"), ("part", "forward"))
        assert vals[("roundgate_round_part_duration_seconds_sum", forward)] == pytest.approx(
            (prefill + decode) * PARTS.forward
        )
    # The group's rounds by kind, once (rank 0): what `roundgate calibrate` reads.
    group = (("group", "g0"), ("kind", "{}"), ("model", "tiny-moe"))
    kinds = {
        k: tuple((a, b.format(k) if a == "kind" else b) for a, b in group)
        for k in ("decode", "extend")
    }
    assert vals[("roundgate_group_round_duration_seconds_count", kinds["extend"])] == prefill
    assert vals[("roundgate_group_round_duration_seconds_count", kinds["decode"])] == decode
    # Each lasted from its gather to the next (the group's round), not this rank's own parts.
    for kind, count in (("extend", prefill), ("decode", decode)):
        total = vals[("roundgate_group_round_duration_seconds_sum", kinds[kind])]
        assert total == pytest.approx(count * ROUND_S)
    ranks = {dict(k[1]).get("dp_rank") for k in vals if k[0] == "roundgate_rank_running_requests"}
    assert ranks == {"0", "1"}
    assert not any(k[0].endswith("_created") for k in vals)


def test_merge_sums_equal_series_across_sources() -> None:
    a, b = RequestMetricSet(), RequestMetricSet()
    a.ttft.labels("m").observe(0.01)
    b.ttft.labels("m").observe(0.02)
    b.finished.labels("m", "stop").inc()
    vals = values(render(merge([snapshot(a.registry), snapshot(b.registry)])).decode())
    assert vals[("roundgate_request_ttft_seconds_count", (("model", "m"),))] == 2
    assert (
        vals[("roundgate_requests_finished_total", (("finish_reason", "stop"), ("model", "m")))]
        == 1
    )


def test_names_follow_the_conventions() -> None:
    registries = [RankMetricSet().registry, RequestMetricSet().registry]
    for registry in registries:
        for fam in registry.collect():
            assert fam.name.startswith("roundgate_")
            assert fam.name == fam.name.lower()
            if fam.type == "histogram" and "rounds" not in fam.name:
                assert fam.name.endswith("_seconds"), fam.name


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed")
def test_promtool_check_metrics_is_clean() -> None:
    recorders = run_group()
    req = RequestMetricSet()
    req.ttft.labels("tiny-moe").observe(0.1)
    req.finished.labels("tiny-moe", "length").inc()
    snaps = [snapshot(r.set.registry) for r in recorders] + [snapshot(req.registry)]
    text = render(merge(snaps))
    proc = subprocess.run(
        ["promtool", "check", "metrics"], input=text, capture_output=True, timeout=30
    )
    assert proc.returncode == 0, proc.stdout.decode() + proc.stderr.decode()


def test_busiest_work_takes_each_quantity_from_its_busiest_rank() -> None:
    rows = [
        RankRow(
            num_tokens=3, batch_size=3, num_extends=0, wants_prefill=False, has_decode_work=True
        ),
        RankRow(
            num_tokens=130, batch_size=2, num_extends=1, wants_prefill=True, has_decode_work=True
        ),
    ]
    # Rank 0 decodes the most sequences (3), rank 1 extends the most prompt tokens (129).
    assert busiest_work(rows) == (3, 129)


def test_group_work_counters_sum_the_rounds_of_each_kind() -> None:
    recorders = run_group()
    vals = values(render(merge(snapshot(r.set.registry) for r in recorders)).decode())

    def work(kind: str, quantity: str) -> float:
        labels = (("group", "g0"), ("kind", kind), ("model", "tiny-moe"), ("quantity", quantity))
        return vals[("roundgate_group_round_work_total", labels)]

    # Prompts of 10 and 6 tokens: 10 when they extend in one round, 16 when apart.
    assert work("extend", "prefill_tokens") in (10, 16)
    assert work("decode", "prefill_tokens") == 0
    # "a" decodes 29 times after its prefill sample, "b" 4: each decode round carries 1 or 2.
    decode_rounds = vals[
        ("roundgate_decode_rounds_total", (("group", "g0"), ("model", "tiny-moe")))
    ]
    assert decode_rounds <= work("decode", "decodes") <= 2 * decode_rounds


def test_each_rank_reports_its_weight_path() -> None:
    recorders = [RankMetrics("g0", "m", rank) for rank in range(2)]
    recorders[0].note_weight_path("packed")
    recorders[1].note_weight_path("float")  # e.g. a rank whose CPU lacks AVX2
    vals = values(render(merge(snapshot(r.set.registry) for r in recorders)).decode())
    series = {
        (dict(labels)["dp_rank"], dict(labels)["path"]): v
        for (name, labels), v in vals.items()
        if name == "roundgate_rank_weight_path"
    }
    assert series == {("0", "packed"): 1.0, ("1", "float"): 1.0}


def test_an_elastic_rank_reads_its_own_row_at_its_place_in_the_epoch() -> None:
    """Seat 1 alone in its group (the first to load started it) is row 0 of one-row rounds;
    its series keep dp_rank 1 and the group's size and re-forms are recorded."""
    (loop,) = make_loops(make_args(1, num_kv_pages=64))
    rec = RankMetrics("g0", "tiny-llama", 1)
    rec.note_group(1, None, row_rank=0)
    loop.scheduler.add_request(make_request("a", prompt_len=6, max_tokens=4, token=1))
    for i in range(6):
        rows = [loop.begin()]
        outcome = loop.finish(rows)
        rec.observe(outcome, loop.scheduler, replace(PARTS, gathered_at=i * ROUND_S), 0)
    rec.note_group(2, "join", row_rank=1)
    vals = values(render(merge([snapshot(rec.set.registry)])).decode())
    labels = (("dp_rank", "1"), ("group", "g0"), ("model", "tiny-llama"))
    assert vals[("roundgate_group_size", labels)] == 2
    assert (
        vals[
            (
                "roundgate_group_reforms_total",
                (*labels[:2], ("model", "tiny-llama"), ("reason", "join")),
            )
        ]
        == 1
    )
