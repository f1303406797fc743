"""P/D faults, live (pd.yaml on the tiny preset): a failed KV transfer fails its request alone
(a 500), the stream beside it and later requests carry on, and no page leaks on either role;
a role whose peer never comes is a startup error naming the peer."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.integration.helpers import BackgroundStream, complete
from tests.integration.pd_deploy import URL, deploy_pd, pd_config, pools_settled, role_call

MODEL = "tiny-llama"


@pytest.fixture(scope="module")
def pd_tiny(app: Any) -> Iterator[str]:
    """The shared deployment replaced by pd.yaml on the tiny preset; restored after."""
    before = dict(app.overrides)
    deploy_pd(model=MODEL)
    yield URL
    app.deploy(**before)


def test_a_failed_transfer_fails_that_request_alone(pd_tiny: str) -> None:
    prompt = list(range(3, 40))
    beside = BackgroundStream(pd_tiny, prompt=[5, 6, 7], max_tokens=200, ignore_eos=True)
    assert beside.started.wait(60)
    role_call("prefill", "inject_transfer_faults", 1)
    r = httpx.post(
        f"{pd_tiny}/v1/completions",
        json={"prompt": prompt, "max_tokens": 8, "temperature": 0},
        timeout=60,
    )
    assert r.status_code == 500, r.text
    assert "KV transfer from prefill rank 0 failed" in r.json()["error"]["message"]
    # The same prompt again, now transferred: the failure left nothing behind on either side.
    again = complete(pd_tiny, prompt=prompt, max_tokens=8, temperature=0)
    assert again["choices"][0]["finish_reason"] == "length"
    assert beside.done.wait(120) and beside.error is None
    assert beside.events[-1] == "[DONE]"
    stats = pools_settled()
    assert stats["decode"]["aborts"] == 0


def test_a_client_gone_during_decode_leaks_no_page(pd_tiny: str) -> None:
    gone = BackgroundStream(pd_tiny, prompt=list(range(50, 90)), max_tokens=400, ignore_eos=True)
    assert gone.started.wait(60)
    gone.close()
    pools_settled()


def test_a_peer_that_never_joins_is_a_startup_error_naming_it(pd_tiny: str) -> None:
    """The decode role cannot be placed (more CPUs than the cluster has): the prefill rank's
    link join times out, naming the decode rank, and the deploy fails with that message."""
    from ray import serve

    from deployment.local import build

    cfg = pd_config(model=MODEL, collective_timeout_s=3, decode={"num_cpus_per_rank": 64})
    with pytest.raises(RuntimeError, match=r"Failed to update the deployments \['PrefillRank'\]"):
        serve.run(build(cfg), name="roundgate", route_prefix="/")
    # What `serve status` shows for the role that failed: the peer it waited for, by name.
    status = serve.status().applications["roundgate"].deployments["PrefillRank"]
    assert "P/D link: decode rank 0 did not join within 3 s" in status.message
