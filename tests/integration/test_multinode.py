"""Beyond one node: a real two-node Ray cluster (two raylets on loopback, each with its own CPUs
and a custom resource), shared by this module's tests.

The session's one-node cluster is ended first (this module sorts after every other; nothing
after it needs the shared app), and every node and process started here is shut down after.
On it: a dp=2 elastic group spread over both nodes (``gang_placement: spread``) serves and
streams, its idle pause and wake crossing nodes through the TCP store, ``/metrics`` naming
both ranks; P/D with its roles pinned to different nodes (``resources_per_rank``) moves KV over
a TCP pair; the worker node lost under streaming load costs only its rank (the group re-forms
on the head node's rank, no stream fails) and the group returns to two ranks when a node comes
back; ``roundgate serve --address`` joins the running cluster and leaves it running.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.integration.helpers import BackgroundStream, complete, wait_for

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
PORT = int(os.environ.get("ROUNDGATE_TEST_PORT", "18765")) + 7
URL = f"http://127.0.0.1:{PORT}"
DEADLINE_S = 240.0  # a condition's deadline, not an expectation of speed
STREAM = {"max_tokens": 300, "ignore_eos": True, "temperature": 0}


@dataclass
class TwoNodes:
    """The cluster, its worker node (removable), and how to bring one back."""

    cluster: Any
    worker: Any

    def add_worker(self) -> None:
        self.worker = self.cluster.add_node(num_cpus=2, resources={"node_b": 1})
        self.cluster.wait_for_nodes()

    def lose_worker(self) -> None:
        self.cluster.remove_node(self.worker, allow_graceful=False)
        self.worker = None


@pytest.fixture(scope="module")
def two_nodes() -> Iterator[TwoNodes]:
    from deployment.local import shutdown, use_loopback_env

    use_loopback_env()
    import ray
    from ray import serve
    from ray.cluster_utils import Cluster

    if ray.is_initialized():  # the session's one-node cluster: nothing after this needs it
        shutdown(serve, ray)
    started = time.monotonic()
    cluster = Cluster(
        initialize_head=True,
        head_node_args={
            "num_cpus": 2,
            "resources": {"node_a": 1},
            "include_dashboard": False,
            "node_ip_address": "127.0.0.1",
        },
    )
    nodes = TwoNodes(cluster, None)
    try:
        nodes.add_worker()
        ray.init(address=cluster.address, logging_level="WARNING")
        print(f"two-node cluster up in {time.monotonic() - started:.1f} s")
        yield nodes
    finally:
        shutdown(serve, ray)
        cluster.shutdown()


def config(**args: Any) -> dict[str, Any]:
    from deployment.local import load_config

    cfg = load_config(REPO / "deployment" / "configs" / "local.yaml")
    cfg["http_options"]["port"] = PORT
    cfg["applications"][0]["args"].update(args)
    return cfg


def deploy(**args: Any) -> dict[str, Any]:
    from deployment import local

    cfg = config(**args)
    local.deploy(cfg)
    local.wait_ready(URL)
    return cfg


def rank_call(method: str, rank: int, deployment: str = "RankReplica") -> Any:
    from ray import serve

    from actors.control.messages import RankTarget

    handle = serve.get_deployment_handle(deployment, app_name="roundgate")
    return getattr(handle, method).remote(RankTarget(rank)).result(timeout_s=30)


def group_sizes() -> list[int]:
    return [rank_call("stats_snapshot", r)["group_size"] for r in range(2)]


def wait_whole(what: str) -> None:
    wait_for(group_sizes, DEADLINE_S, what, until=lambda s: s == [2, 2], errors=(Exception,))


def node_names() -> dict[str, str]:
    """Node id -> the custom resource that names it (``node_a``: the head)."""
    import ray

    return {
        n["NodeID"]: next(k for k in n["Resources"] if k.startswith("node_"))
        for n in ray.nodes()
        if n["Alive"]
    }


def test_a_spread_group_serves_and_wakes_across_nodes(two_nodes: TwoNodes) -> None:
    deploy(model="tiny-llama", elastic_dp=True, gang_placement="spread")
    wait_whole("one group of two")
    names = node_names()
    where = [names[rank_call("stats_snapshot", r)["node_id"]] for r in range(2)]
    assert sorted(where) == ["node_a", "node_b"], where
    # Each request below meets a paused (idle) group: the wake crosses nodes (TCP store).
    for rank in (0, 1, None):
        pinned = {} if rank is None else {"dp_rank": rank}
        time.sleep(0.5)
        body = complete(URL, prompt=[5, 6, 7], max_tokens=8, **pinned)
        assert body["choices"][0]["finish_reason"] == "length"
    stream = BackgroundStream(URL, prompt=[9, 9, 9], max_tokens=24, ignore_eos=True)
    assert stream.done.wait(60) and stream.error is None and stream.events[-1] == "[DONE]"
    text = httpx.get(f"{URL}/metrics", timeout=30).text
    for rank in (0, 1):
        assert f'dp_rank="{rank}"' in text


def test_losing_the_worker_node_costs_only_its_rank(two_nodes: TwoNodes) -> None:
    """Streams on both ranks; the worker node (its raylet and every process on it) is killed:
    the head node's rank re-forms alone and keeps serving, no stream fails, and the group is two
    again once a node comes back."""
    names = node_names()
    wait_whole("one group of two")
    where = [names[rank_call("stats_snapshot", r)["node_id"]] for r in range(2)]
    on_head = where.index("node_a")
    streams = [BackgroundStream(URL, prompt=[7, 8, 9 + i], **STREAM) for i in range(4)]
    for s in streams:
        assert s.started.wait(60), s.error
    lost_at = time.monotonic()
    two_nodes.lose_worker()
    wait_for(
        lambda: rank_call("stats_snapshot", on_head)["group_size"],
        DEADLINE_S,
        "the head node's rank to re-form alone",
        until=lambda size: size == 1,
        errors=(Exception,),
    )
    reformed_s = time.monotonic() - lost_at
    answer = complete(URL, prompt=[3, 4, 5], max_tokens=4)
    assert answer["choices"][0]["finish_reason"] == "length"
    for s in streams:
        assert s.done.wait(DEADLINE_S), "a stream never ended"
        assert s.error is None and not s.in_stream_errors(), (s.error, s.in_stream_errors())
        assert s.events[-1] == "[DONE]"
    served_s = time.monotonic() - lost_at
    two_nodes.add_worker()
    wait_whole("the group back to two once a node came back")
    print(
        f"node lost: re-formed after {reformed_s:.1f} s, every stream served after "
        f"{served_s:.1f} s, two ranks again after {time.monotonic() - lost_at:.1f} s"
    )


def test_pd_roles_on_two_nodes_move_kv_over_tcp(two_nodes: TwoNodes) -> None:
    from deployment import local

    cfg = local.load_config(REPO / "deployment" / "configs" / "pd.yaml")
    cfg["http_options"]["port"] = PORT
    args = cfg["applications"][0]["args"]
    args["model"] = "tiny-llama"
    args["prefill"]["resources_per_rank"] = {"node_a": 0.1}
    args["decode"]["resources_per_rank"] = {"node_b": 0.1}
    local.deploy(cfg)
    local.wait_ready(URL)
    names = node_names()
    prefill = rank_call("stats_snapshot", 0, "PrefillRank")
    decode = rank_call("stats_snapshot", 0, "DecodeRank")
    assert (names[prefill["node_id"]], names[decode["node_id"]]) == ("node_a", "node_b")
    prompt = list(range(3, 60))  # several pages
    body = complete(URL, prompt=prompt, max_tokens=8, temperature=0)
    assert body["choices"][0]["finish_reason"] == "length"
    text = httpx.get(f"{URL}/metrics", timeout=30).text
    assert "roundgate_kv_transfer" in text


def test_serve_address_joins_a_running_cluster(two_nodes: TwoNodes, tmp_path: Path) -> None:
    """``roundgate serve --address`` deploys on the running cluster and, stopped, removes its
    app and leaves the cluster (and whatever else runs on it) up."""
    import ray
    from ray import serve

    serve.delete("roundgate")
    cfg = config(model="tiny-llama", elastic_dp=False, dp_size=1)
    path = tmp_path / "joined.yaml"
    path.write_text(yaml.safe_dump(cfg))
    proc = subprocess.Popen(
        [sys.executable, "-m", "cli.main", "serve", "--config", str(path), "--address",
         two_nodes.cluster.address],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )  # fmt: skip
    try:
        wait_for(
            lambda: (
                httpx.post(
                    f"{URL}/v1/completions", json={"prompt": "hi", "max_tokens": 2}, timeout=10
                ).status_code
            ),
            DEADLINE_S,
            "the joined deployment to answer",
            until=lambda status: status == 200,
            errors=(httpx.HTTPError,),
        )
    finally:
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out[-2000:]
    assert "roundgate ready on" in out
    assert ray.is_initialized() and len([n for n in ray.nodes() if n["Alive"]]) == 2
    assert "roundgate" not in serve.status().applications
