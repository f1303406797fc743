"""The prefix-cache metrics of a rank: queries and hits in tokens, cached pages."""

from __future__ import annotations

from builders import make_args, make_loops
from test_metrics import PARTS, values

from roundgate.actors.control.request import Request, SamplingParams
from roundgate.actors.telemetry.metrics_hub import merge, render, snapshot
from roundgate.actors.telemetry.rank_metrics import RankMetrics

LABELS = (("dp_rank", "0"), ("group", "g0"), ("model", "tiny-moe"))


def test_hits_and_queries_count_tokens_and_every_first_chunk_is_timed() -> None:
    (loop,) = make_loops(make_args(1, "none", enable_prefix_caching=True, num_kv_pages=32))
    rec = RankMetrics("g0", "tiny-moe", 0)
    prompt = list(range(20, 38))  # 18 tokens: four full pages of 4
    for i, tail in enumerate(([], [1, 2], [3])):
        rid = f"r{i}"
        loop.scheduler.add_request(Request(rid, prompt + tail, SamplingParams(max_tokens=2)))
        rec.note_arrival(rid)
        while loop.scheduler.has_unfinished:
            rows = [loop.begin()]
            rec.observe(loop.finish(rows), loop.scheduler, PARTS, None)
    vals = values(render(merge([snapshot(rec.set.registry)])).decode())
    assert vals[("roundgate_prefix_cache_queries_total", LABELS)] == 18 + 20 + 19
    assert vals[("roundgate_prefix_cache_hits_total", LABELS)] == 0 + 16 + 16
    assert loop.scheduler.prefix.num_hits == 32
    # r0's four pages, plus r1's and r2's fifth (its prompt and first output token).
    assert vals[("roundgate_rank_kv_cached_pages", LABELS)] == 6
    assert vals[("roundgate_request_queue_seconds_count", LABELS)] == 3
