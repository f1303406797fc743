"""A rank killed (or hung) under streaming load on a served config: what the clients see.

    .venv/bin/python benchmarks/elastic_faults.py [--config deployment/configs/local.yaml]
        [--streams 8] [--max-tokens 300] [--fault kill|hang] [--repeat 1] [--gang]
        [--port 8300] [--json out.json] [--set KEY=VALUE ...]
    .venv/bin/python benchmarks/elastic_faults.py --config deployment/configs/pd.yaml \
        --pd-role decode|prefill [--streams 8] [--max-tokens 300]

Starts a local Ray cluster on loopback, deploys the config (``--gang``: with ``elastic_dp``
off, today's whole-gang restart, for the figures beside), and runs ``--streams`` greedy
streams: half pinned to dp_rank 0 (the survivor), half unpinned. Once every stream has
started it kills rank 1's process (SIGKILL; ``hang``: SIGSTOP, then SIGCONT once the group
re-formed without it) and reports: streams that failed (an HTTP error or an error event), the
longest gap between two tokens of a stream pinned to the survivor, seconds until rank 0's
group is one rank (re-formed) and until it is two again (the replacement joined), and the
streams' output tokens/s before the fault and while the group was short of a rank.
``--repeat N`` kills N times in a row (fresh streams each time). ``--set model=tiny-moe``
serves a MoE model whose experts are sharded over the ranks (elastic expert parallelism);
``--set num_redundant_experts=4`` gives every expert a second copy. Also reported: seconds
until a new unpinned request is answered.

With a P/D config, ``--pd-role`` names the role whose rank 0 is killed (SIGKILL) once every
stream (all unpinned: P/D routes each request itself) has started; the role restarts alone
and rejoins the P/D link. Reported: streams that failed, the longest gap between two tokens of
any stream, seconds until the role runs a new process and until a new request is answered.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parent.parent


class Stream(threading.Thread):
    """One streaming completion; the arrival time of every chunk with text."""

    def __init__(self, url: str, body: dict[str, Any]) -> None:
        super().__init__(daemon=True)
        self.url, self.body = url, {**body, "stream": True}
        self.times: list[float] = []
        self.tokens = 0
        self.error: str | None = None
        self.started = threading.Event()
        self.start()

    def run(self) -> None:
        try:
            with (
                httpx.Client(timeout=httpx.Timeout(600, connect=10)) as client,
                client.stream("POST", f"{self.url}/v1/completions", json=self.body) as r,
            ):
                if r.status_code != 200:
                    self.error = f"HTTP {r.status_code}: {r.read()[:200]!r}"
                    return
                for line in r.iter_lines():
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    event = json.loads(line[6:])
                    if "error" in event:
                        self.error = str(event["error"])[:200]
                        return
                    if event.get("choices") and event["choices"][0].get("text"):
                        self.times.append(time.monotonic())
                        self.tokens += 1
                        self.started.set()
        except Exception as exc:
            self.error = f"{type(exc).__name__}: {exc}"[:200]
        finally:
            self.started.set()


def rank_stats(handle: Any, rank: int) -> dict[str, Any]:
    from roundgate.actors.control.messages import RankTarget

    return handle.stats_snapshot.remote(RankTarget(rank)).result(timeout_s=10)


def wait_size(handle: Any, size: int, deadline_s: float) -> float | None:
    start = time.monotonic()
    while time.monotonic() - start < deadline_s:
        try:
            if rank_stats(handle, 0)["group_size"] == size:
                return time.monotonic() - start
        except Exception:
            pass
        time.sleep(0.2)
    return None


def chunks_per_s(streams: list[Stream], t0: float, t1: float) -> float:
    n = sum(1 for s in streams for t in s.times if t0 <= t < t1)
    return n / (t1 - t0) if t1 > t0 else 0.0


def one_fault(url: str, handle: Any, ns: argparse.Namespace, elastic: bool) -> dict[str, Any]:
    if elastic and wait_size(handle, 2, 300) is None:
        raise RuntimeError("the group never reached two ranks")
    body = {"max_tokens": ns.max_tokens, "ignore_eos": True, "temperature": 0}
    half = ns.streams // 2
    pinned = [Stream(url, {**body, "prompt": [5, 6, 7 + i], "dp_rank": 0}) for i in range(half)]
    free = [Stream(url, {**body, "prompt": [9, 8, 7 + i]}) for i in range(ns.streams - half)]
    streams = pinned + free
    for s in streams:
        s.started.wait(120)
    time.sleep(3.0)  # a steady window before the fault
    victim = rank_stats(handle, 1)
    fault_at = time.monotonic()
    os.kill(victim["pid"], signal.SIGKILL if ns.fault == "kill" else signal.SIGSTOP)
    answered: list[float] = []
    asker = threading.Thread(target=_first_answer, args=(url, fault_at, answered), daemon=True)
    asker.start()
    reformed_s = wait_size(handle, 1, 120) if elastic else None
    if ns.fault == "hang":
        os.kill(victim["pid"], signal.SIGCONT)
    rejoined_s = wait_size(handle, 2, 300) if elastic else None
    for s in streams:
        s.join(600)
    degraded_end = fault_at + (rejoined_s or 0.0)
    gaps = [b - a for s in pinned for a, b in zip(s.times, s.times[1:], strict=False)]
    return {
        "streams": len(streams),
        "failed": sum(1 for s in streams if s.error),
        "errors": sorted({s.error for s in streams if s.error}),
        "longest_gap_survivor_s": round(max(gaps), 3) if gaps else None,
        "reformed_after_s": None if reformed_s is None else round(reformed_s, 2),
        "new_request_answered_after_s": round(answered[0], 2) if answered else None,
        "back_to_2_after_s": None if rejoined_s is None else round(rejoined_s, 2),
        "tok_s_before": round(chunks_per_s(streams, fault_at - 3.0, fault_at), 1),
        "tok_s_degraded": round(
            chunks_per_s(streams, fault_at + (reformed_s or 0.0), degraded_end), 1
        )
        if rejoined_s
        else None,
    }


def _first_answer(url: str, since: float, out: list[float]) -> None:
    """Seconds from ``since`` until a new, unpinned request is answered (tried every 0.1 s)."""
    body = {"prompt": [3, 4, 5], "max_tokens": 2, "temperature": 0}
    while time.monotonic() - since < 300:
        try:
            r = httpx.post(f"{url}/v1/completions", json=body, timeout=60)
            if r.status_code == 200:
                out.append(time.monotonic() - since)
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)


def pd_fault(url: str, ns: argparse.Namespace) -> dict[str, Any]:
    from ray import serve

    handle = serve.get_deployment_handle(f"{ns.pd_role.capitalize()}Rank", app_name="roundgate")
    body = {"max_tokens": ns.max_tokens, "ignore_eos": True, "temperature": 0}
    streams = [Stream(url, {**body, "prompt": [9, 8, 7 + i]}) for i in range(ns.streams)]
    for s in streams:
        s.started.wait(120)
    time.sleep(3.0)  # a steady window before the fault
    victim = rank_stats(handle, ns.pd_rank)
    fault_at = time.monotonic()
    os.kill(victim["pid"], signal.SIGKILL)
    restarted_s = answered_s = None
    # Both moments are waited for: a request can be answered (by the role's other ranks, or
    # by a restarted prefill rank before a stats probe reaches it) before the new process is
    # seen, and the other way round.
    while time.monotonic() - fault_at < 300 and (answered_s is None or restarted_s is None):
        if restarted_s is None:
            try:
                if rank_stats(handle, ns.pd_rank)["pid"] != victim["pid"]:
                    restarted_s = time.monotonic() - fault_at
            except Exception:
                pass
        if answered_s is None:
            try:
                r = httpx.post(
                    f"{url}/v1/completions", json={"prompt": [1, 2], "max_tokens": 1}, timeout=30
                )
                if r.status_code == 200:
                    answered_s = time.monotonic() - fault_at
            except httpx.HTTPError:
                pass
        time.sleep(0.2)
    for s in streams:
        s.join(600)
    gaps = [b - a for s in streams for a, b in zip(s.times, s.times[1:], strict=False)]
    return {
        "role": ns.pd_role,
        "streams": len(streams),
        "failed": sum(1 for s in streams if s.error),
        "errors": sorted({s.error for s in streams if s.error}),
        "longest_gap_s": round(max(gaps), 3) if gaps else None,
        "new_process_after_s": None if restarted_s is None else round(restarted_s, 2),
        "new_request_answered_after_s": None if answered_s is None else round(answered_s, 2),
        "tok_s_before": round(chunks_per_s(streams, fault_at - 3.0, fault_at), 1),
    }


def overrides(pairs: list[str]) -> dict[str, Any]:
    """``--set KEY=VALUE`` pairs as app args."""
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise SystemExit(f"--set {pair!r}: expected KEY=VALUE")
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            out[key] = value
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", type=Path, default=REPO / "deployment/configs/local.yaml")
    p.add_argument("--streams", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=300)
    p.add_argument("--fault", choices=("kill", "hang"), default="kill")
    p.add_argument("--repeat", type=int, default=1)
    p.add_argument("--gang", action="store_true", help="elastic_dp off (whole-gang restart)")
    p.add_argument("--port", type=int, default=8300)
    p.add_argument("--json", type=Path, default=None)
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an app arg over the config's (VALUE as JSON, else a string), e.g. "
        "--set model=tiny-moe --set num_redundant_experts=4",
    )
    p.add_argument(
        "--pd-role", choices=("prefill", "decode"), default=None, help="P/D: the role to kill"
    )
    p.add_argument("--pd-rank", type=int, default=0, help="P/D: which rank of the role to kill")
    ns = p.parse_args(argv)
    sys.path.insert(0, str(REPO))
    from roundgate.deployment.local import (
        deploy,
        load_config,
        shutdown,
        start_local_cluster,
        wait_ready,
    )

    cfg = load_config(ns.config)
    cfg["http_options"]["port"] = ns.port
    elastic = not ns.gang and bool(cfg["applications"][0]["args"].get("elastic_dp"))
    if ns.pd_role and "prefill" not in cfg["applications"][0]["args"]:
        p.error(f"--pd-role needs a P/D config; {ns.config} has no prefill section")
    start_local_cluster()
    import ray
    from ray import serve

    try:
        deploy(cfg, {**overrides(ns.set), "elastic_dp": elastic})
        url = f"http://127.0.0.1:{ns.port}"
        wait_ready(url)
        handle = None if ns.pd_role else serve.get_deployment_handle("RankReplica", "roundgate")
        runs = []
        for i in range(ns.repeat):
            run = pd_fault(url, ns) if ns.pd_role else one_fault(url, handle, ns, elastic)
            print(f"fault {i + 1}/{ns.repeat}: {json.dumps(run)}", flush=True)
            runs.append(run)
            if not elastic and not ns.pd_role:
                time.sleep(15)  # the gang restarts
        if ns.json:
            ns.json.write_text(
                json.dumps(
                    {"args": vars(ns) | {"config": str(ns.config)}, "runs": runs},
                    indent=1,
                    default=str,
                )
            )
    finally:
        shutdown(serve, ray)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
