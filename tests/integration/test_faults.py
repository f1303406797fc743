"""Killing a rank mid-request: every caller in flight gets its whole answer, resumed once the
gang has restarted (``roundgate.deployment.resume``: no error event in a stream that already
started, a 200 for a unary call), new requests are refused with 503 and ``Retry-After`` until the
gang has restarted (a fresh process group), and then every rank answers again. ``/health`` answers
503 soon after the kill (within Serve's health check and the ingress's cache of it) and 200 again
once the gang has re-formed.

The test breaks the session's shared deployment on purpose, so it may run in any order: the
``restored`` fixture returns only once one fresh gang serves on every rank again (unpinned and
pinned to each rank), and redeploys the application if it never does.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import httpx
import pytest
import ray
from helpers import BackgroundStream, Unary, WaitTimeout, wait_for
from ray.serve.exceptions import RayServeException

if TYPE_CHECKING:
    from integration.conftest import Deployment

# Deadlines for conditions, not expectations of speed: a restart takes ~10 s on the 2-core
# box; these only bound how long a broken build takes to fail.
RESTART_DEADLINE_S = 300.0
TEARDOWN_DEADLINE_S = 120.0  # the test itself has already waited, unless it failed early
PROBE_TIMEOUT_S = 30.0
# Requests in flight at a kill now run to their end (resumed after the restart): long enough
# to be running when the rank dies, short enough to finish soon after the restart.
RESUMED = {"max_tokens": 600, "ignore_eos": True}
# Restarts in a row under load; each must leave every rank routable. The elastic path's ten
# kills are test_elastic_dp.py's; this is the whole-group restart's (MoE groups, P/D roles).
KILLS = 3
HEALTH_POLL_S = 0.2
# deployment/app.py's ``health_check_period_s`` for the rank replicas (their timeout is
# ``max(10, --collective-timeout-s)``): with the ingress's cache of Serve's status, what bounds
# how long a dead rank can go unreported by /health (``health_deadline_s``).
SERVE_HEALTH_CHECK_PERIOD_S = 2.0


def post(url: str, **body: Any) -> httpx.Response:
    return httpx.post(f"{url}/v1/completions", json=body, timeout=PROBE_TIMEOUT_S)


def retry_after_s(r: httpx.Response) -> int | None:
    value = r.headers.get("retry-after", "")
    return int(value) if value.isdigit() else None


# The refusals docs/operations.md documents while a gang restarts: the group's in-flight
# requests end with ``group_unavailable``; new ones, for the seconds after, ``group_restarting``.
RESTART_CODES = frozenset({"group_unavailable", "group_restarting"})


def refusal_problems(r: httpx.Response) -> list[str]:
    """What is wrong with ``r`` as a refusal of a failed group (empty when it is a proper 503:
    ``Retry-After`` in whole seconds and an OpenAI error body of type service_unavailable whose
    code is one of ``RESTART_CODES``)."""
    problems = []
    if r.status_code != 503:
        problems.append(f"status {r.status_code}")
    if not retry_after_s(r):
        problems.append(f"Retry-After {r.headers.get('retry-after')!r}")
    try:
        error = r.json().get("error") or {}
    except ValueError:
        error = {}
    if error.get("type") != "service_unavailable" or not error.get("message"):
        problems.append(f"body {r.text[:300]!r}")
    elif error.get("code") not in RESTART_CODES:
        problems.append(f"code {error.get('code')!r} (want one of {sorted(RESTART_CODES)})")
    return problems


def transport_problem(exc: httpx.HTTPError) -> str | None:
    """Why ``exc`` is not an allowed answer during a restart (None when it is). Only a read
    timeout is: a call pinned to a rank that Serve has not announced yet waits for it
    (docs/operations.md), which may outlast ``PROBE_TIMEOUT_S``. A refused or reset
    connection, or a proxy that drops the request, is never part of a restart: the HTTP
    proxy and the ingress keep running while the rank gang restarts."""
    if isinstance(exc, httpx.ReadTimeout):
        return None
    return f"transport error {exc!r}"


class Serving:
    """One probe round: an unpinned completion and one pinned to each rank.

    Every HTTP answer must be a 200 or a proper refusal, and the only transport error allowed
    is a read timeout (``transport_problem``, "not yet"); anything else is recorded in
    ``violations``.
    """

    def __init__(self, app: Deployment) -> None:
        self.app = app
        self.violations: list[str] = []
        self.refusals = 0

    def __repr__(self) -> str:
        return f"Serving(refusals={self.refusals}, violations={self.violations})"

    def __call__(self) -> dict[str, Any]:
        seen: dict[str, Any] = {}
        for rank in (None, *range(self.app.args["dp_size"])):
            pin = {} if rank is None else {"dp_rank": rank}
            key = "unpinned" if rank is None else f"rank {rank}"
            try:
                r = post(self.app.url, prompt="again", max_tokens=2, **pin)
            except httpx.HTTPError as exc:
                seen[key] = repr(exc)
                if problem := transport_problem(exc):
                    self.violations.append(f"{key}: {problem}")
                continue
            seen[key] = r.status_code
            if r.status_code == 200:
                continue
            problems = refusal_problems(r)
            if problems:
                self.violations.append(f"{key}: {problems}")
            else:
                self.refusals += 1
        return seen


def all_200(seen: dict[str, Any]) -> bool:
    return all(v == 200 for v in seen.values())


def one_fresh_gang(app: Deployment, old_gang: str) -> dict[str, Any]:
    """Every rank's snapshot, pinned: one gang id (not ``old_gang``) and no recorded error."""
    snaps = [app.rank_call("stats_snapshot", r) for r in range(app.args["dp_size"])]
    return {
        "ranks": [s["dp_rank"] for s in snaps],
        "gangs": sorted({s["gang_id"] for s in snaps}),
        "errors": [s["error"] for s in snaps],
        "old_gang": old_gang,
    }


def fresh(seen: dict[str, Any]) -> bool:
    return (
        seen["ranks"] == list(range(len(seen["ranks"])))
        and len(seen["gangs"]) == 1
        and seen["old_gang"] not in seen["gangs"]
        and not any(seen["errors"])
    )


def wait_fresh_gang(app: Deployment, old_gang: str) -> None:
    wait_for(
        lambda: one_fresh_gang(app, old_gang),
        60,
        "both ranks to report one new gang id and no error",
        until=fresh,
        errors=(ray.exceptions.RayError, RayServeException, TimeoutError),
    )


def rank_deployment_status() -> str:
    """Serve's own view of the rank deployment (a diagnostic for a failed wait)."""
    from ray import serve

    try:
        d = serve.status().applications["roundgate"].deployments["RankReplica"]
    except (KeyError, ray.exceptions.RayError, RayServeException) as exc:
        return f"unavailable ({exc!r})"
    return f"{d.status}, replicas {dict(d.replica_states)}"


def wait_serving(
    app: Deployment, probe: Serving | None = None, deadline_s: float = RESTART_DEADLINE_S
) -> None:
    try:
        wait_for(
            probe or Serving(app),
            deadline_s,
            "an unpinned completion and one pinned to each rank to answer 200",
            until=all_200,
            interval_s=1.0,
        )
    except WaitTimeout as exc:
        raise WaitTimeout(f"{exc}; Serve reports RankReplica {rank_deployment_status()}") from None


@pytest.fixture
def restored(app: Deployment) -> Iterator[Deployment]:
    """The app; afterwards, even if the test failed, it serves on every rank again."""
    yield app
    try:
        wait_serving(app, deadline_s=TEARDOWN_DEADLINE_S)
    except WaitTimeout:
        from ray import serve

        serve.delete("roundgate")
        app.deploy(**app.overrides)
        raise


# /health's refusals: Serve reports a rank replica not running (the gang re-forming), or the
# ingress has just seen the group fail (``check_available``, the same window as requests).
HEALTH_CODES = frozenset({"ranks_unhealthy", "group_restarting"})


def health_deadline_s(app: Deployment) -> float:
    """How long after a rank dies /health may still answer 200: one of Serve's health
    checks (period plus timeout) and the ingress's cached reading of Serve's status."""
    from roundgate.deployment.ingress import HEALTH_CACHE_S

    check_timeout_s = max(10.0, app.args["collective_timeout_s"])
    return SERVE_HEALTH_CHECK_PERIOD_S + check_timeout_s + HEALTH_CACHE_S + HEALTH_POLL_S


class HealthWatch(threading.Thread):
    """``GET /health`` polled until it has answered 503 and then 200 again.

    ``answers`` keeps each change of answer (seconds since start, status, error code);
    ``answered``, ``refused`` and ``recovered`` fire on the first answer, the first 503 and
    the first 200 after it. A 503 that is not a proper refusal (``Retry-After``, a
    service_unavailable body with one of ``HEALTH_CODES``) lands in ``violations``.
    """

    def __init__(self, url: str, deadline_s: float) -> None:
        super().__init__(daemon=True)
        self.url, self.deadline = url, time.monotonic() + deadline_s  # never outlives a test
        self.answers: list[tuple[float, int | str, str | None]] = []
        self.violations: list[str] = []
        self.answered, self.refused = threading.Event(), threading.Event()
        self.recovered, self.stop = threading.Event(), threading.Event()
        self.started_at = time.monotonic()
        self.refused_at = self.recovered_at = 0.0
        self.start()

    def __repr__(self) -> str:
        return f"HealthWatch(answers={self.answers}, violations={self.violations})"

    def run(self) -> None:
        while not self.recovered.is_set() and time.monotonic() < self.deadline:
            status, code = self.probe()
            now = time.monotonic()
            if not self.answers or self.answers[-1][1:] != (status, code):
                self.answers.append((round(now - self.started_at, 2), status, code))
            self.answered.set()
            if status == 503 and not self.refused.is_set():
                self.refused_at = now
                self.refused.set()
            elif status == 200 and self.refused.is_set():
                self.recovered_at = now
                self.recovered.set()
            if self.stop.wait(HEALTH_POLL_S):
                return

    def probe(self) -> tuple[int | str, str | None]:
        try:
            r = httpx.get(f"{self.url}/health", timeout=PROBE_TIMEOUT_S)
        except httpx.HTTPError as exc:
            return type(exc).__name__, None
        if r.status_code != 503:
            return r.status_code, None
        try:
            error = r.json().get("error") or {}
        except ValueError:
            error = {}
        code = error.get("code")
        if code not in HEALTH_CODES or error.get("type") != "service_unavailable":
            self.violations.append(f"body {r.text[:300]!r}")
        if not retry_after_s(r):
            self.violations.append(f"Retry-After {r.headers.get('retry-after')!r}")
        return 503, code


def health_code(url: str) -> str | None:
    """The error code of ``GET /health`` (None when it answers 200)."""
    r = httpx.get(f"{url}/health", timeout=PROBE_TIMEOUT_S)
    return None if r.status_code == 200 else (r.json().get("error") or {}).get("code")


def finishes(stream: BackgroundStream) -> list[str]:
    """The finish reasons a stream reported."""
    return [
        c["finish_reason"]
        for e in stream.events
        if isinstance(e, dict) and "choices" in e
        for c in e["choices"]
        if c["finish_reason"]
    ]


def test_killing_a_rank_resumes_the_requests_in_flight_and_the_gang_restarts(restored) -> None:
    app = restored
    wait_serving(app)  # whatever ran before, start from a serving group
    victim = app.rank_call("stats_snapshot", 1)
    # A stream on the survivor (it learns of the failure from the broken collective) and a
    # unary call on the victim (its actor dies under it); both pinned, so both resume on their
    # own rank of the restarted gang.
    stream = BackgroundStream(app.url, prompt=[1, 2, 3], dp_rank=0, **RESUMED)
    unary = Unary(app.url, prompt=[4, 5, 6], dp_rank=1, **RESUMED)
    assert stream.started.wait(60), "the stream on rank 0 never produced an event"
    wait_for(
        lambda: app.rank_call("stats_snapshot", 1)["running"],
        60,
        "the unary request to be running on rank 1",
    )
    assert unary.is_alive(), f"the unary request ended before the kill: {unary.response}"
    assert not stream.done.is_set(), f"the stream ended before the kill: {stream.events[-3:]}"
    # /health, watched from before the kill: 200, then 503 while the gang re-forms, then 200.
    health = HealthWatch(app.url, RESTART_DEADLINE_S)
    assert health.answered.wait(PROBE_TIMEOUT_S), f"/health never answered: {health}"
    assert health.answers[0][1] == 200, f"/health refused a serving group: {health}"

    ray.kill(ray.get_actor(victim["actor_name"], namespace="serve"), no_restart=False)
    killed_at = time.monotonic()

    # Sent as soon as the ingress has seen the failure (the requests in flight resume), inside
    # the window it refuses new requests.
    wait_for(
        lambda: health_code(app.url),
        PROBE_TIMEOUT_S,
        "the ingress to see the group fail (/health: group_restarting)",
        until=lambda code: code == "group_restarting",
        interval_s=0.05,
    )
    first_after = post(app.url, prompt="right after", max_tokens=2)
    unary.join(RESTART_DEADLINE_S)
    assert not unary.is_alive(), "the unary request on the killed rank hung"
    assert stream.done.wait(RESTART_DEADLINE_S), "the stream on the surviving rank hung"

    assert unary.error is None, f"the unary caller got no HTTP answer: {unary.error!r}"
    assert unary.response is not None
    assert unary.response.status_code == 200, unary.response.text[:500]
    body = unary.response.json()
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["usage"]["completion_tokens"] == RESUMED["max_tokens"]
    assert body["usage"]["prompt_tokens"] == 3

    assert stream.error is None, f"the stream broke: {stream.error!r}"
    errors = [e for e in stream.events if isinstance(e, dict) and "error" in e]
    assert errors == [], f"a resumed stream reports no error: {errors}"
    assert finishes(stream) == ["length"] and stream.events[-1] == "[DONE]"

    assert refusal_problems(first_after) == [], (first_after.status_code, first_after.text[:500])
    unreported_s = health_deadline_s(app)
    health.refused.wait(max(0.0, killed_at + unreported_s - time.monotonic()))
    assert health.refused.is_set() and health.refused_at - killed_at <= unreported_s, (
        f"/health did not answer 503 within {unreported_s:.0f}s of the kill: {health}"
    )

    probe = Serving(app)
    wait_for(
        lambda: probe().get("unpinned"),
        RESTART_DEADLINE_S,
        "an unpinned completion to answer 200 after the restart",
        until=lambda status: status == 200,
        interval_s=1.0,
    )
    wait_serving(app, probe, deadline_s=TEARDOWN_DEADLINE_S)
    assert probe.violations == [], f"answers while restarting, not 200 nor a proper 503: {probe}"
    assert health.recovered.wait(max(0.0, killed_at + RESTART_DEADLINE_S - time.monotonic())), (
        f"/health never answered 200 again after its 503: {health}"
    )
    assert health.violations == [], f"/health's 503s are not proper refusals: {health}"
    print(
        f"/health after the kill: 503 after {health.refused_at - killed_at:.1f} s, 200 again "
        f"after {health.recovered_at - killed_at:.1f} s; answers {health.answers}"
    )

    wait_fresh_gang(app, victim["gang_id"])


def test_a_hung_rank_is_declared_failed_and_the_gang_restarts(restored) -> None:
    """A rank alive but not joining the gather (SIGSTOP: a stuck kernel, a paused process):
    its peer's gather times out after ``--collective-timeout-s``, the stream in flight on the
    peer is resumed once a fresh gang serves and ends with no error, and new requests meanwhile
    get a 200 or a 503 with ``Retry-After``."""
    import os
    import signal

    app = restored
    wait_serving(app)
    victim = app.rank_call("stats_snapshot", 1)
    stream = BackgroundStream(app.url, prompt=[1, 2, 3], dp_rank=0, **RESUMED)
    assert stream.started.wait(60), "the stream on rank 0 never produced an event"
    stopped_at = time.monotonic()
    os.kill(victim["pid"], signal.SIGSTOP)
    try:
        # The peer's gather times out; the ingress, seeing the failure, answers /health (and
        # new requests) 503 ``group_restarting`` for a while.
        wait_for(
            lambda: health_code(app.url),
            app.args["collective_timeout_s"] + 60,
            "the ingress to see the group fail (/health: group_restarting)",
            until=lambda code: code == "group_restarting",
            interval_s=HEALTH_POLL_S,
        )
        detected_s = time.monotonic() - stopped_at
        refused = post(app.url, prompt="while restarting", max_tokens=2)
        assert refused.status_code == 200 or refusal_problems(refused) == [], refused.text[:300]
        assert not stream.done.is_set(), (
            f"the stream ended instead of resuming: {stream.events[-3:]}"
        )
    finally:
        os.kill(victim["pid"], signal.SIGCONT)  # Serve replaces it; never leave it stopped
    assert stream.done.wait(RESTART_DEADLINE_S), "the resumed stream never ended"
    assert stream.error is None, f"the stream broke: {stream.error!r}"
    errors = [e for e in stream.events if isinstance(e, dict) and "error" in e]
    assert errors == [], f"a resumed stream reports no error: {errors}"
    assert finishes(stream) == ["length"] and stream.events[-1] == "[DONE]"
    wait_serving(app)
    recovered_s = time.monotonic() - stopped_at
    wait_fresh_gang(app, victim["gang_id"])
    print(
        f"hung rank: failure seen after {detected_s:.1f} s, serving again after {recovered_s:.1f} s"
    )


class Load(threading.Thread):
    """Short completions, one after another until stopped, unpinned and pinned to each rank in
    turn: the traffic a restart happens under (a pinned call arriving while the router knows
    one member of the new gang once froze the ingress's router). Every answer must be a 200 or
    a proper refusal, and the only transport error a read timeout (``violations`` otherwise;
    ``statuses`` counts transport errors by name); after a refusal it waits a little, as a
    client honouring ``Retry-After`` would, only shorter."""

    def __init__(self, url: str, dp_size: int) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.pins = [{}] + [{"dp_rank": r} for r in range(dp_size)]
        self.stop = threading.Event()
        self.statuses: dict[int | str, int] = {}
        self.violations: list[str] = []
        self.start()

    def run(self) -> None:
        sent = 0
        while not self.stop.is_set():
            pin = self.pins[sent % len(self.pins)]
            sent += 1
            try:
                r = post(self.url, prompt="under load", max_tokens=8, **pin)
            except httpx.HTTPError as exc:
                if problem := transport_problem(exc):
                    self.violations.append(f"{pin} {problem}")
                name = type(exc).__name__
                self.statuses[name] = self.statuses.get(name, 0) + 1
                self.stop.wait(0.2)
                continue
            self.statuses[r.status_code] = self.statuses.get(r.status_code, 0) + 1
            if r.status_code != 200:
                if refusal_problems(r):
                    self.violations.append(f"{pin} {r.status_code}: {r.text[:200]}")
                self.stop.wait(0.2)


def test_a_rank_killed_ten_times_under_load_leaves_every_rank_routable(restored) -> None:
    """After each of ``KILLS`` restarts (the victim alternating between the ranks, traffic
    flowing throughout) an unpinned call and a call pinned to each rank answer 200 through the
    ingress, and every rank reports the same fresh gang."""

    app = restored
    wait_serving(app)
    load = Load(app.url, app.args["dp_size"])
    recoveries = []
    try:
        for kill in range(KILLS):
            victim = app.rank_call("stats_snapshot", kill % app.args["dp_size"])
            killed_at = time.monotonic()
            ray.kill(ray.get_actor(victim["actor_name"], namespace="serve"), no_restart=False)
            probe = Serving(app)
            try:
                wait_serving(app, probe)
            except WaitTimeout as exc:
                raise AssertionError(f"after kill {kill + 1} of {KILLS}: {exc}") from None
            assert probe.violations == [], f"kill {kill + 1}: {probe.violations}"
            wait_fresh_gang(app, victim["gang_id"])
            recoveries.append(time.monotonic() - killed_at)
    finally:
        load.stop.set()
        load.join(PROBE_TIMEOUT_S + 10)
    assert load.violations == [], load.violations[:5]
    assert load.statuses.get(200), f"the load never got an answer: {load.statuses}"
    print(
        f"{KILLS} kills: every rank routable again after {min(recoveries):.1f}-"
        f"{max(recoveries):.1f} s (median {sorted(recoveries)[KILLS // 2]:.1f} s); "
        f"load answers {load.statuses}"
    )
