"""Every registered prefill policy, served once on the shared tiny-preset group (dp=2).

For each policy the shared application is redeployed with ``--prefill-policy`` and the
policy's simulate defaults (the other policies' flags unset), then:

- a stream pinned to each rank produces its tokens: the policy admitted both prompts (a policy
  that never opens leaves the stream without a chunk and fails at the deadline);
- ``/metrics`` names the policy on both ranks of the live gang (``rank_prefill_policy``, the
  gang's series only: a previous gang's linger a while), and no other policy there;
- each rank of the live gang counts a prefill round of its own.

The policy already deployed (``roundgate``, implied by local.yaml's intervals) is served as it
is; each other costs one redeploy, and the module puts back what it found once at the end.
Readiness is ``/health`` (every rank replica running), not a completion: a completion would
need the policy under test to admit it before the test has even started.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from helpers import BackgroundStream, wait_for
from prometheus_client.parser import text_string_to_metric_families

from roundgate.gate import registry

RANKS = (0, 1)
MAX_TOKENS = 2
# Deadlines for conditions, not expectations of speed: they bound how long a broken build
# (a policy that never opens, a gauge never pushed) takes to fail. The slowest policy to open
# for a lone prompt at its simulate defaults is SGLang's delayer (5 s of ``max_delay_ms``).
FIRST_CHUNK_S = 60.0
READY_S = 180.0
METRICS_S = 30.0  # the hub's staleness window: a live rank has pushed well within it


def policy_overrides(name: str) -> dict[str, Any]:
    """The app args that select ``name`` with its simulate defaults; every other policy's
    flag unset (None), since a flag of another policy is refused by name."""
    cleared = dict.fromkeys(registry.all_flags())
    return {**cleared, **registry.comparison_flags(name, {}), "prefill_policy": name}


def deployed_policy(args: dict[str, Any]) -> str:
    return args.get("prefill_policy") or registry.implied_policy(
        {k: v for k, v in args.items() if v is not None}
    )


def health(url: str) -> int | str:
    try:
        return httpx.get(f"{url}/health", timeout=10).status_code
    except httpx.HTTPError as exc:
        return repr(exc)


@pytest.fixture(scope="module")
def served(app: Any) -> Iterator[Any]:
    """The shared deployment; whatever it served before comes back once, after the module."""
    before = dict(app.overrides)
    yield app
    if app.overrides != before:
        app.deploy(**before)


def deploy_policy(app: Any, name: str) -> None:
    """Redeploy with ``name`` selected, ready once ``/health`` answers 200."""
    from ray import serve

    from roundgate.deployment.local import deploy

    app.overrides = policy_overrides(name)
    deploy(app.cfg, app.overrides)
    app.ranks = serve.get_deployment_handle("RankReplica", app_name="roundgate")
    wait_for(lambda: health(app.url), READY_S, "/health to answer 200", until=lambda s: s == 200)


def live_gang(app: Any) -> str:
    (gang,) = {app.rank_call("stats_snapshot", r)["gang_id"] for r in RANKS}
    return gang


def gang_series(url: str, gang: str) -> dict[str, Any]:
    """The live gang's policies at 1 and prefill rounds, by rank, from one scrape."""
    text = httpx.get(f"{url}/metrics", timeout=30).raise_for_status().text
    policies: dict[int, list[str]] = {}
    prefills: dict[int, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.labels.get("group") != gang:
                continue
            if s.name == "roundgate_rank_prefill_policy" and s.value == 1:
                policies.setdefault(int(s.labels["dp_rank"]), []).append(s.labels["policy"])
            elif s.name == "roundgate_rank_prefill_rounds_total":
                prefills[int(s.labels["dp_rank"])] = s.value
    return {"policies": policies, "prefill_rounds": prefills}


@pytest.mark.parametrize("name", registry.names())
def test_the_policy_serves_a_stream_and_shows_in_metrics(served: Any, name: str) -> None:
    if deployed_policy(served.args) != name:
        deploy_policy(served, name)
    gang = live_gang(served)
    streams = [
        BackgroundStream(
            served.url, prompt=[11, 12, 13], max_tokens=MAX_TOKENS, ignore_eos=True, dp_rank=r
        )
        for r in RANKS
    ]
    try:
        for rank, stream in zip(RANKS, streams, strict=True):
            assert stream.started.wait(FIRST_CHUNK_S), (
                f"{name}: no chunk on rank {rank} in {FIRST_CHUNK_S:.0f}s (prompt never admitted)"
            )
            assert stream.done.wait(FIRST_CHUNK_S), f"{name}: the stream on rank {rank} hung"
            assert stream.error is None, repr(stream.error)
            chunks = [e for e in stream.events if isinstance(e, dict)]
            assert not [e for e in chunks if "error" in e], chunks[-2:]
            reasons = [c["finish_reason"] for e in chunks for c in e["choices"]]
            assert reasons[-1] == "length" and stream.events[-1] == "[DONE]", chunks[-2:]
    finally:
        for stream in streams:
            stream.close(timeout=5)  # one never started stays blocked on its read (a daemon)

    def settled(seen: dict[str, Any]) -> bool:
        # Both ranks pushed a snapshot taken after their prompt's prefill round.
        rounds = seen["prefill_rounds"]
        return set(seen["policies"]) == set(RANKS) and all(rounds.get(r, 0) >= 1 for r in RANKS)

    seen = wait_for(
        lambda: gang_series(served.url, gang),
        METRICS_S,
        f"both ranks of gang {gang} in /metrics, each with a prefill round",
        until=settled,
        # Right after a redeploy the ingress may answer one scrape with a 500; a /metrics
        # that keeps failing still fails here, with its last error.
        errors=(httpx.HTTPStatusError,),
    )
    assert seen["policies"] == {r: [name] for r in RANKS}, seen
