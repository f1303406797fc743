"""A two-node Ray cluster on this machine: start and deploy times, one group against two, and
what a lost node costs.

    .venv/bin/python benchmarks/multinode.py [--model smollm2-135m-instruct] [--requests 32]
        [--port 8400] [--json out.json]

Starts two raylets on loopback (``ray.cluster_utils.Cluster``; each 2 CPUs and a custom
resource, ``node_a`` the head), then:

1. the time the cluster took to start, and each deploy's time until it answers;
2. ``roundgate bench`` at concurrency 8 (``--requests`` requests, 256 prompt and 64 output
   tokens) against one elastic dp=2 group spread over both nodes, then against two such groups
   (both on the same two cores: a measure of the second group's cost, not of scale);
3. with the two groups serving eight greedy streams, the worker node killed (its raylet and
   every process on it): seconds until each group re-formed on its head-node rank, until every
   stream ended (and how many failed), and until both groups were two ranks again after a new
   node joined.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parent.parent


def stream(url: str, prompt: list[int], out: dict[str, Any]) -> None:
    """One greedy 300-token stream; ``out["error"]`` set if it failed."""
    body = {"prompt": prompt, "max_tokens": 300, "ignore_eos": True, "temperature": 0}
    try:
        with (
            httpx.Client(timeout=httpx.Timeout(600, connect=10)) as client,
            client.stream("POST", f"{url}/v1/completions", json={**body, "stream": True}) as r,
        ):
            r.raise_for_status()
            for line in r.iter_lines():
                if line.startswith("data: ") and '"error"' in line:
                    out["error"] = line[:200]
                out["started"] = True
    except Exception as exc:
        out["error"] = f"{type(exc).__name__}: {exc}"[:200]


def bench(url: str, requests: int, folder: Path, label: str) -> dict[str, float]:
    report = folder / f"{label}.json"
    subprocess.run(
        [sys.executable, "-m", "roundgate.cli.main", "bench", "--url", url, "--concurrency", "8",
         "--num-requests", str(requests), "--input-len", "256", "--output-len", "64",
         "--seed", "7", "--json", str(report), "--no-progress"],
        cwd=REPO, check=False, stdout=subprocess.DEVNULL,
    )  # fmt: skip
    s = json.loads(report.read_text())["results"]["bench"]
    return {"out_tok_s": s["output_tokens_per_s"], "itl_p50_ms": s["itl_ms"]["p50"]}


def sizes(gangs: list[tuple[str, int]]) -> list[int]:
    from ray import serve

    from roundgate.actors.control.messages import RankTarget

    handle = serve.get_deployment_handle("RankReplica", app_name="roundgate")
    return [
        handle.stats_snapshot.remote(RankTarget(r, g)).result(timeout_s=10)["group_size"]
        for g, r in gangs
    ]


def wait_sizes(gangs: list[tuple[str, int]], size: int) -> None:
    """Until every named rank reports a group of ``size`` (a rank between lives may not
    answer: try again)."""
    while True:
        try:
            if sizes(gangs) == [size] * len(gangs):
                return
        except Exception:
            pass
        time.sleep(0.2)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--requests", type=int, default=32)
    p.add_argument("--port", type=int, default=8400)
    p.add_argument("--json", type=Path, default=None)
    ns = p.parse_args()
    from roundgate.actors.control.messages import RankTarget
    from roundgate.deployment.local import (
        deploy,
        load_config,
        shutdown,
        use_loopback_env,
        wait_ready,
    )

    use_loopback_env()
    import ray
    from ray import serve
    from ray.cluster_utils import Cluster

    url = f"http://127.0.0.1:{ns.port}"
    result: dict[str, Any] = {}
    started = time.monotonic()
    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 2, "resources": {"node_a": 1}, "include_dashboard": False,
                        "node_ip_address": "127.0.0.1"},
    )  # fmt: skip
    folder = Path("/tmp") / f"roundgate-multinode-{ns.port}"
    folder.mkdir(exist_ok=True)
    try:
        cluster.add_node(num_cpus=2, resources={"node_b": 1}, node_ip_address="127.0.0.1")
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, logging_level="WARNING")
        result["cluster_start_s"] = time.monotonic() - started
        cfg = load_config(REPO / "deployment" / "configs" / "local.yaml")
        cfg["http_options"]["port"] = ns.port
        base = {"model": ns.model, "elastic_dp": True, "gang_placement": "spread",
                "ingress_resources": {"node_a": 0.01}}  # fmt: skip
        for groups in (1, 2):
            # A fresh app each time: Serve's rolling update would start the new version's
            # replicas beside the old ones, and ``max_replicas_per_node`` (spread) counts both.
            if groups > 1:
                serve.delete("roundgate")
            t0 = time.monotonic()
            deploy(cfg, {**base, "num_groups": groups})
            wait_ready(url)
            result[f"deploy_{groups}_groups_s"] = time.monotonic() - t0
            handle = serve.get_deployment_handle("RankReplica", app_name="roundgate")
            every = [("", 0)]
            while True:  # every rank of every group answering, the groups whole
                text = httpx.get(f"{url}/metrics", timeout=30).text
                every = sorted(
                    {(line.split('group="')[1].split('"')[0], int(line.split('dp_rank="')[1][0]))
                     for line in text.splitlines() if line.startswith("roundgate_group_size{")}
                )  # fmt: skip
                if len(every) == 2 * groups and sizes(every) == [2] * len(every):
                    break
                time.sleep(0.5)
            result[f"whole_{groups}_groups_s"] = time.monotonic() - t0
            bench(url, 4, folder, f"warm{groups}")
            result[f"bench_{groups}_groups"] = bench(url, ns.requests, folder, f"g{groups}")
            print(json.dumps(result), flush=True)
        names = {n["NodeID"]: next(k for k in n["Resources"] if k.startswith("node_"))
                 for n in ray.nodes() if n["Alive"]}  # fmt: skip
        on_head = [
            (g, r)
            for g, r in every
            if names[handle.stats_snapshot.remote(RankTarget(r, g)).result(timeout_s=10)["node_id"]]
            == "node_a"
        ]
        outs: list[dict[str, Any]] = [{} for _ in range(8)]
        threads = [
            threading.Thread(target=stream, args=(url, [7, 8, 9 + i], outs[i]), daemon=True)
            for i in range(8)
        ]
        for t in threads:
            t.start()
        while not all(o.get("started") or o.get("error") for o in outs):
            time.sleep(0.1)
        lost = time.monotonic()
        worker = next(n for n in cluster.worker_nodes)
        cluster.remove_node(worker, allow_graceful=False)
        wait_sizes(on_head, 1)
        result["node_loss_reformed_s"] = time.monotonic() - lost
        for t in threads:
            t.join(600)
        result["node_loss_all_streams_ended_s"] = time.monotonic() - lost
        result["node_loss_failed_streams"] = sum(1 for o in outs if o.get("error"))
        cluster.add_node(num_cpus=2, resources={"node_b": 1}, node_ip_address="127.0.0.1")
        cluster.wait_for_nodes()
        wait_sizes(every, 2)
        result["node_loss_whole_again_s"] = time.monotonic() - lost
    finally:
        print(json.dumps(result, indent=1))
        if ns.json:
            ns.json.write_text(json.dumps(result, indent=1))
        shutdown(serve, ray)
        cluster.shutdown()


if __name__ == "__main__":
    main()
