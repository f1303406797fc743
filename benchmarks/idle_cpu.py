"""Idle cost of the local deployment, and the first request after an idle spell.

    .venv/bin/python benchmarks/idle_cpu.py [--config deployment/configs/local.yaml]
        [--window-s 30] [--idle-s 60] [--requests 5] [--cold-samples 1]

Starts a local cluster, deploys the config beside an engine-less Serve replica (the floor:
Serve's own health checks and stats), serves a few warm requests, lets the group go idle, then
reads each replica process's CPU time over ``--window-s`` seconds (``psutil``, user + system).
Then it times ``--requests`` warm completions back to back, and ``--cold-samples`` more, each
after ``--idle-s`` seconds of idling: the idle group must wake within a few percent of a warm
one's TTFT.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import httpx
import psutil

FLOOR_APP = "idle_floor"


def replica_processes() -> dict[str, psutil.Process]:
    """Serve replica processes by title (``ray::ServeReplica:<app>:<deployment>``)."""
    found: dict[str, psutil.Process] = {}
    for proc in psutil.process_iter(["cmdline"]):
        cmd = " ".join(proc.info["cmdline"] or [])
        if "ServeReplica:" in cmd:
            title = cmd.split("ServeReplica:", 1)[1].split()[0]
            found[f"{title} (pid {proc.pid})"] = proc
    return found


def cpu_seconds(proc: psutil.Process) -> float:
    times = proc.cpu_times()
    return times.user + times.system


def ttft(url: str, prompt: str) -> float:
    body = {"prompt": prompt, "max_tokens": 1, "temperature": 0, "stream": True}
    started = time.perf_counter()
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=120) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if line.startswith("data: {"):
                return time.perf_counter() - started
    raise RuntimeError("no token came back")


def floor_latency(url: str) -> float:
    started = time.perf_counter()
    httpx.get(url, timeout=60).raise_for_status()
    return time.perf_counter() - started


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", type=Path, default=Path("deployment/configs/local.yaml"))
    p.add_argument("--window-s", type=float, default=30.0)
    p.add_argument("--idle-s", type=float, default=60.0)
    p.add_argument("--requests", type=int, default=5)
    p.add_argument("--cold-samples", type=int, default=1)
    ns = p.parse_args()

    from roundgate.deployment.local import (
        deploy,
        load_config,
        shutdown,
        start_local_cluster,
        wait_ready,
    )

    start_local_cluster()
    import ray
    from ray import serve

    @serve.deployment(name="EnginelessReplica", ray_actor_options={"num_cpus": 0})
    class EnginelessReplica:
        def __call__(self) -> str:
            return "ok"

    try:
        cfg = load_config(ns.config)
        deploy(cfg)
        port = cfg["http_options"]["port"]
        url = f"http://127.0.0.1:{port}"
        wait_ready(url)
        serve.run(EnginelessReplica.bind(), name=FLOOR_APP, route_prefix="/idle-floor")
        for i in range(3):
            ttft(url, f"warm up {i}")
        time.sleep(3.0)  # the group finishes its last rounds and pauses
        procs = replica_processes()
        before = {name: cpu_seconds(proc) for name, proc in procs.items()}
        time.sleep(ns.window_s)
        print(f"CPU over {ns.window_s:g} s idle (percent of one core):")
        for name, proc in sorted(procs.items()):
            used = cpu_seconds(proc) - before[name]
            print(f"  {name:60s} {100 * used / ns.window_s:5.2f} %")
        warm = [ttft(url, f"hello number {i}") for i in range(ns.requests)]
        floor_url = f"{url}/idle-floor"
        floor_warm = [floor_latency(floor_url) for _ in range(ns.requests)]
        cold, floor_cold = [], []
        for i in range(ns.cold_samples):
            time.sleep(ns.idle_s)
            cold.append(ttft(url, f"hello after rest {i}"))
            time.sleep(ns.idle_s)
            floor_cold.append(floor_latency(floor_url))
        median, cold_median = statistics.median(warm), statistics.median(cold)
        print(
            f"TTFT (1-token completion): warm median {1e3 * median:.1f} ms "
            f"(min {1e3 * min(warm):.1f}, max {1e3 * max(warm):.1f}); after {ns.idle_s:g} s "
            f"idle, median of {len(cold)}: {1e3 * cold_median:.1f} ms "
            f"(each: {', '.join(f'{1e3 * c:.1f}' for c in cold)}; {cold_median / median:.2f}x)"
        )
        # The same idle spell in front of the engine-less replica: what Serve's own path (proxy,
        # router probes of expired queue-length caches, the replica's event loop) adds alone.
        fw, fc = statistics.median(floor_warm), statistics.median(floor_cold)
        print(
            f"engine-less replica (GET through the proxy): warm median {1e3 * fw:.1f} ms; after "
            f"{ns.idle_s:g} s idle, median {1e3 * fc:.1f} ms "
            f"(each: {', '.join(f'{1e3 * c:.1f}' for c in floor_cold)}; +{1e3 * (fc - fw):.1f} ms)"
        )
    finally:
        shutdown(serve, ray)


if __name__ == "__main__":
    main()
