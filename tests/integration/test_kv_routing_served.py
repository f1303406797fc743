"""The kv-aware and gate-aware routers through the live dp=2 deployment (tiny preset), each
against a round-robin arm on the same workload, with bounds computed from that workload.

Prefix hits: five sessions in three groups (a group's sessions share a system prompt no other
group has), served one request at a time in turn-major order. Five is odd, so round-robin
sends each session's consecutive turns, and the two sessions of a group, to alternate ranks:
a turn finds on its rank only what the request two visits back left there. A prefix-affine
router sends each turn where its session's previous turn is. Both figures are computed from
the prompts and answers actually served (``round_robin_ceiling``, ``affine_floor``), and the
workload is built so the floor is above the ceiling; the hits are counted by the ranks
themselves (final once the answers are back). Every prefix a turn needs was served at
least three requests earlier, so the kv-aware router, which learns what the ranks hold from
their events (one poll behind at worst), knows it in time.

Gate windows: rank 0 decodes a long stream (it blocks the gate's ALL point until it has
prefill backlog itself), rank 1 is idle and holds the prompts' shared prefix. Each new prompt
sent to rank 0 opens the next ALL point; one sent to rank 1 waits for the ANY point. The
windows and admission waits are read from ``/metrics`` once its counts have settled.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import httpx
from helpers import SMALL_CHAT_SESSIONS, BackgroundStream, complete

from roundgate.actors.control.page_keys import PageKey, num_leading, page_keys
from roundgate.actors.telemetry.metrics import WAIT_ROUND_BUCKETS
from roundgate.bench.sessions import scrape_settled
from roundgate.deployment.routing.routers import STALE_AFTER_S
from roundgate.sim.sessions import Session, SessionPreset, SessionSpec, make_sessions

# Session i belongs to group GROUPS[i]: groups {0, 3}, {1, 4} and {2}. Group mates are three
# requests apart (odd: round-robin splits them; three: the kv-aware index has them).
GROUPS = (0, 1, 2, 0, 1)
VOCAB = 256


@dataclass(frozen=True)
class Served:
    """One request as served: its prompt and the answer's token ids."""

    prompt: tuple[int, ...]
    answer: tuple[int, ...]


def grouped_sessions(
    seed: int, groups: Sequence[int] = GROUPS, preset: SessionPreset = SMALL_CHAT_SESSIONS
) -> list[Session]:
    """``make_sessions``' sessions, each with its group's own system prompt (drawn from
    ``seed``, so no other test's cached pages can match it)."""
    spec = SessionSpec(preset, num_sessions=len(groups), vocab_size=VOCAB, seed=seed)
    rng = random.Random(f"systems-{seed}")
    systems = {
        g: tuple(rng.randrange(1, VOCAB) for _ in range(preset.system_len)) for g in set(groups)
    }
    return [replace(s, system=systems[g]) for s, g in zip(make_sessions(spec), groups, strict=True)]


def answer_ids(client: httpx.Client, url: str, model: str, prompt: Sequence[int], n: int) -> tuple:
    r = client.post(
        f"{url}/v1/completions",
        json={
            "model": model,
            "prompt": list(prompt),
            "max_tokens": n,
            "temperature": 0,
            "ignore_eos": True,
            "return_token_ids": True,
        },
    )
    assert r.status_code == 200, r.text
    ids = tuple(r.json()["choices"][0]["token_ids"])
    assert len(ids) == n
    return ids


def serve_turn_major(url: str, model: str, sessions: Sequence[Session]) -> list[Served]:
    """Every session's turn t (in session order) before any turn t + 1, one request at a time:
    the order the bounds below assume. Greedy, so a replay asks the same prompts."""
    served: list[Served] = []
    turns = [s.first_turn() for s in sessions]
    with httpx.Client(timeout=300) as client:
        while any(t is not None for t in turns):
            for i, (session, turn) in enumerate(zip(sessions, turns, strict=True)):
                if turn is None:
                    continue
                prompt = tuple(turn.token_ids or ())
                answer = answer_ids(client, url, model, prompt, turn.output_tokens)
                served.append(Served(prompt, answer))
                turns[i] = session.next_turn(turn, 0.0, answer)
    return served


def simulated_hits(
    served: Sequence[Served], ranks: Sequence[int], page_size: int, with_answers: bool
) -> int:
    """Prompt tokens found cached if request i ran on ``ranks[i]`` and each rank kept the full
    pages of every prompt (and answer, ``with_answers``) it served: a rank reuses at most its
    longest page-aligned prefix, and always computes a prompt's last token."""
    held: dict[int, set[PageKey]] = {}
    hits = 0
    for s, rank in zip(served, ranks, strict=True):
        pool = held.setdefault(rank, set())
        matched = num_leading(page_keys(s.prompt, page_size), pool)
        hits += min(matched * page_size, len(s.prompt) - 1)
        pool.update(page_keys(s.prompt + s.answer if with_answers else s.prompt, page_size))
    return hits


def round_robin_ceiling(served: Sequence[Served], page_size: int) -> int:
    """The most tokens round-robin can hit: consecutive requests on alternate ranks (either
    first), each rank keeping everything it computed, answers included."""
    n = len(served)
    return max(
        simulated_hits(served, [(i + first) % 2 for i in range(n)], page_size, True)
        for first in (0, 1)
    )


def affine_floor(served: Sequence[Served], page_size: int) -> int:
    """The fewest tokens a prefix-affine router hits: each prompt goes where the longest
    prefix of it went, so one rank holds every earlier prompt of its chain (counted without
    the answers: a router may not know of them yet)."""
    return simulated_hits(served, [0] * len(served), page_size, False)


def metric_samples(text: str, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    """Each series of sample ``name`` in one ``/metrics`` scrape, by its labels."""
    from prometheus_client.parser import text_string_to_metric_families

    return {
        tuple(sorted(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == name
    }


def delta(before: str, after: str, name: str, where: Callable[[dict[str, str]], bool]) -> float:
    """How much the series of ``name`` matching ``where`` grew between two scrapes (series
    new in ``after`` count from zero)."""
    old = metric_samples(before, name)
    return sum(
        value - old.get(key, 0.0)
        for key, value in metric_samples(after, name).items()
        if where(dict(key))
    )


def settled(url: str) -> str:
    text = scrape_settled(url)
    assert text is not None, "/metrics unreadable"
    return text


def prefix_counts(app: Any) -> tuple[int, int]:
    """Prompt tokens the ranks looked up in their prefix caches, and found: read from each
    rank itself (counted at admission, so final once the answers are back)."""
    stats = [app.rank_call("stats_snapshot", r) for r in range(app.args["dp_size"])]
    return sum(s["prefix_queries"] for s in stats), sum(s["prefix_hits"] for s in stats)


def hits_arm(app: Any, seed: int, groups: Sequence[int] = GROUPS, **kwargs: Any) -> tuple:
    """The sessions of ``seed`` served (``grouped_sessions``' arguments); the prompt tokens
    looked up and found cached meanwhile."""
    queries, hits = prefix_counts(app)
    served = serve_turn_major(app.url, app.args["model"], grouped_sessions(seed, groups, **kwargs))
    queries_after, hits_after = prefix_counts(app)
    return served, queries_after - queries, hits_after - hits


def hub_call(method: str) -> Any:
    import ray

    from roundgate.actors.control.kv_events import HUB_NAME, HUB_NAMESPACE

    hub = ray.get_actor(HUB_NAME, namespace=HUB_NAMESPACE)
    return ray.get(getattr(hub, method).remote(), timeout=30)


def test_kv_aware_beats_round_robin_on_prefix_hits(redeploy: Any) -> None:
    if redeploy.overrides:  # round-robin arm on the shared default deployment
        redeploy.deploy()
    page_size = redeploy.args["page_size"]
    # Each arm draws its own tokens (same shape): a redeploy may keep the ranks' pools, and
    # the second arm must not find the first arm's pages there.
    rr_served, rr_queries, rr_hits = hits_arm(redeploy, seed=3901)
    # Every prompt was looked up once, and only these: the counts are this arm's.
    assert rr_queries == sum(len(s.prompt) for s in rr_served)
    assert rr_hits <= round_robin_ceiling(rr_served, page_size), rr_hits
    redeploy.deploy(router="kv-aware", enable_prefix_caching=True)
    served, queries, hits = hits_arm(redeploy, seed=3902)
    assert queries == sum(len(s.prompt) for s in served)
    floor, ceiling = affine_floor(served, page_size), round_robin_ceiling(served, page_size)
    assert floor > ceiling, "the workload does not separate affinity from round-robin"
    assert hits >= floor, (
        f"kv-aware hit {hits} of {queries} prompt tokens; a prefix-affine router hits at "
        f"least {floor}, round-robin at most {ceiling}"
    )
    stats = hub_call("stats_dict")
    assert stats["batches_per_s"] > 0 and stats["events_per_s"] > 0
    # The hub holds each rank's keys; every prompt's pages are on the rank that served it.
    held = [s.keys for s in hub_call("snapshots")]
    assert len(held) == 2
    for s in served:
        keys = page_keys(s.prompt, page_size)
        assert any(set(keys) <= k for k in held)


# Gate arm: prompts of a shared 4-page prefix and their own 8 tokens, one at a time, each sent
# a think time after the previous answer. The think time is the workload's, not a wait for an
# event: a kv router routes a prompt that follows the previous one within its staleness bound
# on what the ranks reported before that one arrived (by design: ``STALE_AFTER_S``), so the
# workload's rate sits below it.
NUM_GATE_PROMPTS = 8
GATE_THINK_S = 2 * STALE_AFTER_S


@dataclass(frozen=True)
class GateArm:
    """What one arm of the gate workload did, from the settled scrapes around it."""

    num_prompts: dict[str, float]  # by dp rank: prompts prefilled there
    windows: dict[str, float]  # by point (all, any): open votes that admitted prefill
    num_quick: float  # rank 0's prompts admitted within the ALL interval of their first want


def gate_arm(app: Any, seed: int) -> GateArm:
    rng = random.Random(seed)
    shared = [rng.randrange(1, VOCAB) for _ in range(4 * app.args["page_size"])]
    prompts = [
        shared + [rng.randrange(1, VOCAB) for _ in range(8)] for _ in range(NUM_GATE_PROMPTS)
    ]
    complete(app.url, prompt=shared, max_tokens=1, temperature=0, dp_rank=1)  # rank 1 caches it
    stream = BackgroundStream(
        app.url,
        prompt=[rng.randrange(1, VOCAB) for _ in range(16)],
        max_tokens=4000,
        ignore_eos=True,
        temperature=0,
        dp_rank=0,
    )
    try:
        assert stream.started.wait(60)
        before = settled(app.url)
        for prompt in prompts:
            time.sleep(GATE_THINK_S)
            complete(app.url, prompt=prompt, max_tokens=1, temperature=0)
        after = settled(app.url)
        assert not stream.done.is_set(), "rank 0 stopped decoding before the arm ended"
    finally:
        stream.close()
    length = len(prompts[0])
    interval = app.args["prefill_attempt_interval"]
    quick = min(b for b in WAIT_ROUND_BUCKETS if b >= interval)  # a bucket's bound
    return GateArm(
        num_prompts={
            r: delta(
                before,
                after,
                "roundgate_prefix_cache_queries_total",
                lambda labels, r=r: labels["dp_rank"] == r,
            )
            / length
            for r in ("0", "1")
        },
        windows={
            p: delta(
                before,
                after,
                "roundgate_gate_windows_admitted_total",
                lambda labels, p=p: labels["point"] == p,
            )
            for p in ("all", "any")
        },
        num_quick=delta(
            before,
            after,
            "roundgate_admission_wait_rounds_bucket",
            lambda labels: labels["dp_rank"] == "0" and float(labels["le"]) == quick,
        ),
    )


def test_gate_aware_sends_prompts_where_the_all_point_opens(redeploy: Any) -> None:
    if redeploy.overrides:
        redeploy.deploy()
    half = NUM_GATE_PROMPTS // 2
    rr = gate_arm(redeploy, seed=3903)
    # Round-robin: every other prompt on idle rank 1, where rank 0's decoding blocks the ALL
    # point: each of those waits for an ANY point.
    assert rr.num_prompts == {"0": half, "1": half}, rr
    assert rr.windows["any"] >= half, rr
    redeploy.deploy(router="gate-aware", enable_prefix_caching=True)
    gate = gate_arm(redeploy, seed=3904)
    # Gate-aware: the prompts on rank 0, the one blocking the ALL point (rank 1's cached
    # prefix loses to the gate's term): at most a quarter on rank 1 where round-robin sends
    # half (a choice whose refresh outlasts the router's STALE_WAIT_S goes on the reports
    # from before the previous prompt, by design). Each prompt on rank 0 opens the next ALL
    # point, within the ALL interval of its first want; one window per prompt.
    assert gate.num_prompts["1"] <= NUM_GATE_PROMPTS // 4, gate
    assert gate.num_prompts["0"] + gate.num_prompts["1"] == NUM_GATE_PROMPTS, gate
    assert gate.num_quick == gate.num_prompts["0"], gate
    assert gate.windows["all"] + gate.windows["any"] == NUM_GATE_PROMPTS, gate
