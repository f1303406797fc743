"""Beyond one node: a real two-node Ray cluster (two raylets on loopback, each with its own CPUs
and a custom resource), shared by this module's tests.

The session's one-node cluster is ended first (this module sorts after every other; nothing
after it needs the shared app), and every node and process started here is shut down after. On
it: P/D with its roles pinned to different nodes (``resources_per_rank``) moves KV over a TCP
pair; ``roundgate serve --address`` joins the running cluster and leaves it running; a gang
deployment with ``autoscaling`` grows by a whole group under load and shrinks back after it.
Then two elastic groups of two, each spread over both nodes (``gang_placement: spread``), behind
two ingress replicas (the ingress and the one HTTP proxy on the head node,
``ingress_resources``, ``proxy_location: HeadOnly``): idle pause and wake cross nodes through
the TCP store, streams flow, requests reach every rank of both groups, ``/metrics`` has each
rank's series once per scrape, every ingress replica's kv-aware router reads the ranks' events;
one group's restart leaves the other's epoch alone; and the worker node lost under both groups'
streams costs each group its rank there only (no stream fails), the groups back to two when a
node comes back.
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
from helpers import BackgroundStream, complete, wait_for
from prometheus_client.parser import text_string_to_metric_families

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
        self.worker = self.cluster.add_node(
            num_cpus=2, resources={"node_b": 1}, node_ip_address="127.0.0.1"
        )
        self.cluster.wait_for_nodes()

    def lose_worker(self) -> None:
        self.cluster.remove_node(self.worker, allow_graceful=False)
        self.worker = None


@pytest.fixture(scope="module")
def two_nodes() -> Iterator[TwoNodes]:
    from roundgate.deployment.local import use_loopback_env

    use_loopback_env()
    import ray
    import ray._private.auto_init_hook as auto_init_hook
    from ray.cluster_utils import Cluster

    # Both clusters go with everything on them, Serve's processes too: no graceful drain (a
    # ``serve.shutdown`` still running would reconnect the driver once Ray is down), and the
    # next ``serve.start`` drops the old session's client by itself. Ray's auto-connect is off
    # from here on: a thread that an earlier test left in this process (a metrics pusher, a
    # handle's) making a Ray call between a ``ray.shutdown`` and the next ``ray.init`` would
    # otherwise connect the driver again, and a driver connected to a cluster whose processes
    # are then ended exits the whole pytest process once it gives up on the GCS.
    auto_connect = auto_init_hook.enable_auto_connect
    auto_init_hook.enable_auto_connect = False
    if ray.is_initialized():  # the session's one-node cluster: nothing after this needs it
        ray.shutdown()
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
        ray.shutdown()
        cluster.shutdown()
        auto_init_hook.enable_auto_connect = auto_connect


def config(**args: Any) -> dict[str, Any]:
    from roundgate.deployment.local import load_config

    cfg = load_config(REPO / "deployment" / "configs" / "local.yaml")
    cfg["http_options"]["port"] = PORT
    cfg["applications"][0]["args"].update(args)
    return cfg


def deploy(**args: Any) -> dict[str, Any]:
    from roundgate.deployment import local

    cfg = config(**args)
    local.deploy(cfg)
    local.wait_ready(URL)
    return cfg


def rank_call(
    method: str, rank: int, deployment: str = "RankReplica", gang: str | None = None
) -> Any:
    from ray import serve

    from roundgate.actors.control.messages import RankTarget

    handle = serve.get_deployment_handle(deployment, app_name="roundgate")
    return getattr(handle, method).remote(RankTarget(rank, gang)).result(timeout_s=30)


def node_names() -> dict[str, str]:
    """Node id -> the custom resource that names it (``node_a``: the head)."""
    import ray

    return {
        n["NodeID"]: next(k for k in n["Resources"] if k.startswith("node_"))
        for n in ray.nodes()
        if n["Alive"]
    }


def rank_series(text: str, family: str) -> list[tuple[str, str, float]]:
    """``(group, dp_rank, value)`` of each sample of a rank family in a scrape."""
    return [
        (sample.labels["group"], sample.labels["dp_rank"], sample.value)
        for metric in text_string_to_metric_families(text)
        if metric.name == family
        for sample in metric.samples
        if not sample.name.endswith("_created")
    ]


def scrape() -> str:
    """One ``/metrics`` scrape; a non-200 answer raises (an error page is not an exposition)."""
    return httpx.get(f"{URL}/metrics", timeout=30).raise_for_status().text


def test_pd_roles_on_two_nodes_move_kv_over_tcp(two_nodes: TwoNodes) -> None:
    from roundgate.deployment import local

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
    # The transfer's series reach the hub with the ranks' next push.
    wait_for(scrape, 30, "the KV transfer's series", until=lambda t: "roundgate_kv_transfer" in t)


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
        [sys.executable, "-m", "roundgate.cli.main", "serve", "--config", str(path), "--address",
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


def test_autoscaling_adds_and_removes_whole_groups(two_nodes: TwoNodes) -> None:
    """A gang deployment with ``autoscaling`` (one to two groups of two): eight long streams
    bring up a second whole group, their end takes it away, and Serve never holds a replica
    count that is not whole groups (a gang's two replicas change state one after the other,
    so an odd count may show for a moment, never for seconds)."""
    from ray import serve

    scale = {
        "min_groups": 1,
        "max_groups": 2,
        "target_ongoing_requests_per_rank": 1,
        "upscale_delay_s": 0.5,
        "downscale_delay_s": 1,
        "look_back_period_s": 2,
    }
    deploy(model="tiny-llama", elastic_dp=False, num_groups=1, autoscaling=scale)
    counts: list[int] = []  # every replica Serve has, in any state, at each sample
    odd_since: list[float] = []  # when the current run of odd counts began
    longest_odd_s = 0.0

    def running() -> int:
        nonlocal longest_odd_s
        states = serve.status().applications["roundgate"].deployments["RankReplica"]
        counts.append(sum(states.replica_states.values()))
        if counts[-1] % 2:
            odd_since[:] = odd_since or [time.monotonic()]
            longest_odd_s = max(longest_odd_s, time.monotonic() - odd_since[0])
        else:
            odd_since.clear()
        return states.replica_states.get("RUNNING", 0)

    wait_for(running, 60, "one group at rest", until=lambda n: n == 2)
    streams: list[BackgroundStream] = []

    def loaded() -> int:
        """Eight streams in flight (an ended one replaced), and the running replicas."""
        streams[:] = [s for s in streams if not s.done.is_set()]
        while len(streams) < 8:
            streams.append(
                BackgroundStream(URL, prompt=[2, 3, 4, len(counts) % 50], max_tokens=1000,
                                 ignore_eos=True)
            )  # fmt: skip
        return running()

    try:
        wait_for(loaded, DEADLINE_S, "a second group under load", until=lambda n: n == 4)
    finally:
        for s in streams:
            s.close()
    assert all(s.error is None for s in streams), [s.error for s in streams]
    wait_for(lambda: (running(), counts[-1]), DEADLINE_S, "back to one group",
             until=lambda n: n == (2, 2))  # fmt: skip
    assert longest_odd_s < 3.0, (longest_odd_s, counts)


# Two groups of two, spread: each node holds one rank of each group (``seats.claim`` by node);
# the front door on the head node, so losing the worker node cannot take a client's connection.
TWO_GROUPS = {
    "model": "tiny-llama",
    "elastic_dp": True,
    "gang_placement": "spread",
    "num_groups": 2,
    "ingress_replicas": 2,
    "ingress_resources": {"node_a": 0.01},
    "router": "kv-aware",
    "enable_prefix_caching": True,
}


def ranks_seen() -> dict[tuple[str, int], dict[str, Any]]:
    """(group, dp_rank) -> that rank's ``stats_snapshot``, for every rank in ``/metrics``."""
    keys = {(g, int(r)) for g, r, _ in rank_series(scrape(), "roundgate_group_size")}
    return {(g, r): rank_call("stats_snapshot", r, gang=g) for g, r in sorted(keys)}


def wait_two_whole_groups() -> dict[tuple[str, int], dict[str, Any]]:
    return wait_for(
        ranks_seen,
        DEADLINE_S,
        "two groups of two",
        until=lambda seen: len(seen) == 4 and all(s["group_size"] == 2 for s in seen.values()),
        errors=(Exception,),
    )


def test_two_groups_behind_two_ingress_replicas(two_nodes: TwoNodes) -> None:
    import ray

    from roundgate.actors.control.kv_events import HUB_NAME, HUB_NAMESPACE

    deploy(**TWO_GROUPS)
    seen = wait_two_whole_groups()
    names = node_names()
    groups = sorted({g for g, _ in seen})
    for group in groups:  # a node's loss will cost each group one rank, not one group two
        nodes = sorted(names[seen[(group, r)]["node_id"]] for r in range(2))
        assert nodes == ["node_a", "node_b"], (group, nodes)
    # Each request below meets paused (idle) groups: a wake crosses nodes (the TCP store).
    for rank, group in ((0, groups[0]), (1, groups[1]), (None, None)):
        time.sleep(0.5)
        pinned = {} if rank is None else {"dp_rank": rank}
        body = complete(URL, prompt=[5, 6, 7], max_tokens=8, ignore_eos=True, **pinned)
        assert body["choices"][0]["finish_reason"] == "length", group
    stream = BackgroundStream(URL, prompt=[9, 9, 9], max_tokens=24, ignore_eos=True)
    assert stream.done.wait(60) and stream.error is None and stream.events[-1] == "[DONE]"
    hub = ray.get_actor(HUB_NAME, namespace=HUB_NAMESPACE)
    # Sixteen distinct prompts at once: both ingress replicas' routers spread them.
    from concurrent.futures import ThreadPoolExecutor

    prompts = [[11 + i, 40 + i, *range(60, 60 + 40)] for i in range(16)]
    with ThreadPoolExecutor(8) as pool:
        bodies = list(
            pool.map(lambda p: complete(URL, prompt=p, max_tokens=8, ignore_eos=True), prompts)
        )
    assert all(b["choices"][0]["finish_reason"] == "length" for b in bodies)
    # Every rank prefilled some of them (its metrics reach the hub a push interval later).
    wait_for(
        lambda: {
            (g, int(r)): v for g, r, v in rank_series(scrape(), "roundgate_rank_prefill_tokens")
        },
        30,
        "every rank's share of the prompts",
        until=lambda tokens: (
            sorted(tokens) == sorted(seen)
            and all(v > 0 for v in tokens.values())
            and sum(tokens.values()) >= sum(len(p) for p in prompts)
        ),
    )
    # /metrics: every rank's series once per scrape, whichever ingress replica answers it.
    for _ in range(6):
        keys = [(g, r) for g, r, _ in rank_series(scrape(), "roundgate_group_size")]
        assert sorted(keys) == sorted((g, str(r)) for g, r in seen), keys
    # Every rank's events are in the hub; each ingress replica's router has read up to them.
    held = wait_for(
        lambda: ray.get(hub.snapshots.remote(), timeout=30),
        30,
        "the hub to hold every rank's pages",
        until=lambda snaps: len([s for s in snaps if s.keys]) == 4,
    )
    assert len(held) == 4
    cursor = ray.get(hub.cursor.remote(), timeout=30)
    for i in range(16):  # sequential: Serve's proxy spreads them over both ingress replicas
        complete(URL, prompt=prompts[i], max_tokens=1)
    pollers = ray.get(hub.pollers.remote(), timeout=30)
    current = [p for p, c in pollers.items() if c >= cursor]
    assert len({p.split(":")[1] for p in current}) == 2, (pollers, cursor)


class HubBeingReplaced(Exception):
    """A scrape answered 503 ``metrics_hub_unavailable``: allowed while the hub is replaced."""


def scrape_during_hub_loss() -> str:
    r = httpx.get(f"{URL}/metrics", timeout=30)
    if r.status_code == 503 and r.json()["error"]["code"] == "metrics_hub_unavailable":
        raise HubBeingReplaced(r.text)
    assert r.status_code == 200, (r.status_code, r.text[:500])  # never a 500
    return r.text


def test_every_rank_finds_a_new_metrics_hub_when_the_hub_dies(two_nodes: TwoNodes) -> None:
    """The hub is one actor (on the head node); killed, the next scrape makes a new one and
    every rank's pusher, seeing its last push fail, pushes there: all four ranks are back.
    No scrape meanwhile is a server error: a 200, or a 503 naming the hub."""
    import ray

    from roundgate.actors.telemetry.metrics_hub import HUB_NAME, HUB_NAMESPACE

    seen = wait_two_whole_groups()
    ray.kill(ray.get_actor(HUB_NAME, namespace=HUB_NAMESPACE))
    wait_for(
        lambda: sorted(
            (g, int(r)) for g, r, _ in rank_series(scrape_during_hub_loss(), "roundgate_group_size")
        ),
        60,
        "every rank's series on a new hub",
        until=lambda keys: keys == sorted(seen),
        errors=(HubBeingReplaced,),
    )


def test_a_group_restart_is_invisible_to_the_other_group(two_nodes: TwoNodes) -> None:
    """One rank of one group killed under eight streams: its group re-forms (a new epoch),
    the other group's epoch never changes, and no stream fails."""
    import ray

    seen = wait_two_whole_groups()
    victim_group, other = sorted({g for g, _ in seen})
    before = {r: seen[(other, r)]["epoch"] for r in range(2)}
    victim_epoch = seen[(victim_group, 0)]["epoch"]
    streams = [BackgroundStream(URL, prompt=[4, 5, 6 + i], **STREAM) for i in range(8)]
    for s in streams:
        assert s.started.wait(60), s.error
    ray.kill(ray.get_actor(seen[(victim_group, 1)]["actor_name"], namespace="serve"))
    for s in streams:
        assert s.done.wait(DEADLINE_S), "a stream never ended"
        assert s.error is None and not s.in_stream_errors(), (s.error, s.in_stream_errors())
    seen = wait_two_whole_groups()
    assert {r: seen[(other, r)]["epoch"] for r in range(2)} == before
    assert seen[(victim_group, 0)]["epoch"] > victim_epoch  # it did re-form


def test_losing_the_worker_node_costs_each_group_its_rank_there(two_nodes: TwoNodes) -> None:
    """Both groups stream; the worker node (its raylet and every process on it) is killed:
    each group re-forms on its head-node rank and serves on, no stream fails, and both are two
    again once a node comes back."""
    seen = wait_two_whole_groups()
    names = node_names()
    on_head = [key for key, s in seen.items() if names[s["node_id"]] == "node_a"]
    assert sorted(g for g, _ in on_head) == sorted({g for g, _ in seen})  # one per group
    streams = [BackgroundStream(URL, prompt=[7, 8, 9 + i], **STREAM) for i in range(8)]
    for s in streams:
        assert s.started.wait(60), s.error
    lost_at = time.monotonic()
    two_nodes.lose_worker()
    wait_for(
        lambda: [rank_call("stats_snapshot", r, gang=g)["group_size"] for g, r in on_head],
        DEADLINE_S,
        "each group's head-node rank to re-form alone",
        until=lambda sizes: sizes == [1, 1],
        errors=(Exception,),
    )
    reformed_s = time.monotonic() - lost_at
    answer = complete(URL, prompt=[3, 4, 5], max_tokens=4, ignore_eos=True)
    assert answer["choices"][0]["finish_reason"] == "length"
    for s in streams:
        assert s.done.wait(DEADLINE_S), "a stream never ended"
        assert s.error is None and not s.in_stream_errors(), (s.error, s.in_stream_errors())
        assert s.events[-1] == "[DONE]"
    served_s = time.monotonic() - lost_at
    two_nodes.add_worker()
    wait_two_whole_groups()
    print(
        f"node lost: both groups re-formed after {reformed_s:.1f} s, every stream served "
        f"after {served_s:.1f} s, both groups two again after {time.monotonic() - lost_at:.1f} s"
    )
