"""P/D faults, live (conftest's ``pd_app``: pd.yaml as shipped, shared with test_served_pd.py,
which runs after this module and so also shows the faults changed no later answer): a failed
KV transfer fails its request alone (a 500), the stream beside it and later requests carry on,
and no page leaks on either role; a role whose peer never comes is a startup error naming the
peer."""

from __future__ import annotations

import httpx
import pytest

from tests.integration.helpers import BackgroundStream, complete
from tests.integration.pd_deploy import PDApp, pd_config, pools_settled, role_call

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

    from deployment.local import build

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
