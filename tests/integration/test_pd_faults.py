"""P/D faults, live (conftest's ``pd_app``: pd.yaml as shipped, shared with test_served_pd.py,
which runs after this module and so also shows the faults changed no later answer): a failed
KV transfer fails its request alone (a 500), the stream beside it and later requests carry on,
and no page leaks on either role; a role whose peer never comes is a startup error naming the
peer; a role's rank killed under streaming load restarts and rejoins the link with no redeploy,
and every stream it held carries on with no error and the text of an uninterrupted run (a dead
decode rank's requests continue on a live decode rank, a dead prefill rank's prompts are
prefilled again on a live prefill rank)."""

from __future__ import annotations

import os
import signal

import httpx
import pytest
from helpers import BackgroundStream, complete, wait_for
from pd_deploy import PDApp, pd_config, pools_settled, role_call

# The app that cannot start: its own name and route, so the shared P/D app serves on beside it.
PEER_APP, PEER_ROUTE = "roundgate-peer-test", "/peer-test"


def test_a_failed_transfer_fails_that_request_alone(pd_app: PDApp) -> None:
    prompt = list(range(3, 40))
    beside = BackgroundStream(pd_app.url, prompt=[5, 6, 7], max_tokens=120, ignore_eos=True)
    assert beside.started.wait(60)
    role_call("prefill", "inject_transfer_faults", 1)
    r = httpx.post(
        f"{pd_app.url}/v1/completions",
        json={"prompt": prompt, "max_tokens": 8, "temperature": 0},
        timeout=60,
    )
    assert r.status_code == 500, r.text
    assert "KV transfer from prefill rank 0 failed" in r.json()["error"]["message"]
    # The same prompt again, now transferred: the failure left nothing behind on either side.
    again = complete(pd_app.url, prompt=prompt, max_tokens=8, temperature=0)
    assert again["choices"][0]["finish_reason"] == "length"
    assert beside.done.wait(120) and beside.error is None
    assert beside.events[-1] == "[DONE]"
    stats = pools_settled()
    assert stats["decode"]["aborts"] == 0


def test_a_client_gone_during_decode_leaks_no_page(pd_app: PDApp) -> None:
    gone = BackgroundStream(pd_app.url, prompt=list(range(50, 90)), max_tokens=400, ignore_eos=True)
    assert gone.started.wait(60)
    gone.close()
    pools_settled()


def test_a_peer_that_never_joins_is_a_startup_error_naming_it(pd_app: PDApp) -> None:
    """The decode role cannot be placed (more CPUs than the cluster has): the prefill rank's
    link join times out, naming the decode rank, and the deploy fails with that message. A
    tiny preset and a 1 s join keep Serve's three start attempts short."""
    from ray import serve

    from roundgate.deployment.local import build

    cfg = pd_config(0, model="tiny-llama", collective_timeout_s=1, decode={"num_cpus_per_rank": 64})
    try:
        with pytest.raises(
            RuntimeError, match=r"Failed to update the deployments \['PrefillRank'\]"
        ):
            serve.run(build(cfg), name=PEER_APP, route_prefix=PEER_ROUTE)
        # What `serve status` shows for the role that failed: the peer it waited for, by name.
        status = serve.status().applications[PEER_APP].deployments["PrefillRank"]
        assert "P/D link: decode rank 0 did not join within 1 s" in status.message
    finally:
        # In the background: its never-placed decode rank waits out Serve's 5 s grace period.
        serve.delete(PEER_APP, _blocking=False)
    complete(pd_app.url, prompt=[5, 6, 7], max_tokens=2)  # the shared P/D app serves on


KILL = {"max_tokens": 96, "ignore_eos": True, "temperature": 0}
DEADLINE_S = 240.0  # a condition's deadline (a role's gang restarts and loads its model)


def greedy_texts(url: str, prompts: list[list[int]]) -> list[str]:
    """The uninterrupted answers, one request at a time."""
    return [complete(url, prompt=p, **KILL)["choices"][0]["text"] for p in prompts]


def kill_role(role: str) -> int:
    """SIGKILL rank 0 of ``role``; returns the process id it had."""
    pid = role_call(role, "stats_snapshot")["pid"]
    os.kill(pid, signal.SIGKILL)
    return pid


def serving_again(url: str, role: str, old_pid: int) -> None:
    """Until ``role`` runs a new process and a new request is answered (no redeploy)."""
    wait_for(
        lambda: role_call(role, "stats_snapshot")["pid"],
        DEADLINE_S,
        f"a new {role} process",
        until=lambda pid: pid != old_pid,
        errors=(Exception,),
    )
    wait_for(
        lambda: (
            httpx.post(
                f"{url}/v1/completions", json={"prompt": [5, 6, 7], "max_tokens": 2}, timeout=60
            ).status_code
        ),
        DEADLINE_S,
        "a new request answered",
        until=lambda status: status == 200,
    )


@pytest.mark.parametrize("role", ["decode", "prefill"])
def test_a_killed_role_rank_costs_no_stream(pd_app: PDApp, role: str) -> None:
    """Four greedy streams; the role's only rank is killed once the first has tokens: every
    stream ends whole, with the text it has without the fault."""
    prompts = [list(range(11 + i, 60 + 13 * i)) for i in range(4)]
    want = greedy_texts(pd_app.url, prompts)
    streams = [BackgroundStream(pd_app.url, prompt=p, **KILL) for p in prompts]
    wait_for(
        lambda: len(streams[0].events), 60, "the first stream's tokens", until=lambda n: n >= 8
    )
    old_pid = kill_role(role)
    for stream, text in zip(streams, want, strict=True):
        assert stream.done.wait(DEADLINE_S), "a stream never ended"
        assert stream.error is None and not stream.in_stream_errors(), (
            stream.error,
            stream.in_stream_errors(),
        )
        assert stream.events[-1] == "[DONE]"
        assert stream.text() == text
    serving_again(pd_app.url, role, old_pid)
    pools_settled(timeout_s=60)
