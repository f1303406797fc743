"""What several benchmarks share: serving a config and stopping it, a gloo pair of ranks, and
the model runner's timings. Benchmarks import from here, never from each other.

Heavy imports (torch, the engine) sit inside the functions that need them, so a benchmark that
only serves a config and loads it (``vs_llamacpp``, ``bench_gather served``) pays for none.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

if TYPE_CHECKING:
    from roundgate.actors.model.runner import ModelRunner

REPO = Path(__file__).resolve().parents[1]


# ---- a served config ------------------------------------------------------------------------


def serve_config(
    cfg: dict[str, Any], path: Path, env: dict[str, str] | None = None
) -> subprocess.Popen:
    """``roundgate serve`` on ``cfg`` (written to ``path``), in its own session."""
    path.write_text(yaml.safe_dump(cfg))
    return subprocess.Popen(
        [sys.executable, "-m", "roundgate.cli.main", "serve", "--config", str(path)],
        cwd=REPO,
        env={**os.environ, **(env or {})},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # its Ray processes go with it on stop
    )


def wait_ready(url: str, process: subprocess.Popen, timeout_s: float = 600) -> None:
    """Until ``url`` lists its models; an error if the server exits first or never answers."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the server exited with {process.returncode} before it was ready")
        try:
            with urllib.request.urlopen(f"{url}/v1/models", timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(1)
    raise RuntimeError(f"{url} not ready after {timeout_s:.0f} s")


def stop(process: subprocess.Popen) -> None:
    """SIGINT, then after a minute the whole session (the server's Ray processes too)."""
    process.send_signal(signal.SIGINT)
    try:
        process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()


# ---- a gloo pair ------------------------------------------------------------------------------


def join_pair(rank: int, port: int) -> None:
    """Join a two-rank gloo group on loopback ``port``, one torch thread (as a dp=2 rank)."""
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=2,
        timeout=timedelta(seconds=60),
    )


def run_pair(target: Callable, ns: argparse.Namespace, timeout_s: float) -> dict[int, Any]:
    """``target(rank, port, ns, out)`` in two spawned processes (a gloo pair on a free
    loopback port); what each put on ``out`` as ``(rank, result)``, by rank."""
    import torch.multiprocessing as mp

    from roundgate.actors.replica.rendezvous import free_port

    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=target, args=(r, port, ns, out)) for r in (0, 1)]
    for proc in procs:
        proc.start()
    results = dict(out.get(timeout=timeout_s) for _ in procs)
    for proc in procs:
        proc.join()
    return results


# ---- the model runner's timings ---------------------------------------------------------------


def ragged_prompts(batch: int, low: int, high: int, vocab: int, seed: int) -> list[list[int]]:
    """``batch`` prompts of seeded random lengths in ``[low, high]`` and tokens below ``vocab``."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(low, high + 1, (batch,), generator=gen).tolist()
    return [torch.randint(0, vocab, (n,), generator=gen).tolist() for n in lengths]


def runner_decode_steps(
    runner: ModelRunner,
    prompts: list[list[int]],
    new_tokens: int,
    clock: Callable[[], float] = time.perf_counter,
) -> list[float]:
    """Seconds of each decode round after one prefill round (``new_tokens - 1`` rounds)."""
    from roundgate.actors.control.config import PoolConfig
    from roundgate.actors.control.kv_pool import KVPool
    from roundgate.actors.control.request import Request, SamplingParams
    from roundgate.actors.control.round import RoundPlan, ScheduledChunk

    page_size = runner.args.page_size
    pool = KVPool(PoolConfig(runner.args.num_kv_pages, page_size))
    requests = [
        Request(f"r{i}", p, SamplingParams(max_tokens=new_tokens)) for i, p in enumerate(prompts)
    ]
    for r in requests:
        r.page_ids = pool.allocate(r.request_id, r.num_prompt_tokens + new_tokens)
    plan = RoundPlan(chunks=[ScheduledChunk(r, 0, r.num_tokens, True) for r in requests])
    steps: list[float] = []
    while True:
        started = clock()
        result = runner.execute(plan)
        if plan.num_extends == 0:
            steps.append(clock() - started)
        for chunk in plan.chunks:
            chunk.request.num_computed_tokens = chunk.end
            chunk.request.append_token(result.sampled[chunk.request.request_id])
        live = [r for r in requests if not r.is_finished]
        if not live:
            return steps
        plan = RoundPlan(chunks=[ScheduledChunk(r, r.num_tokens - 1, 1, False) for r in live])


def runner_prefill_seconds(
    runner: ModelRunner, prompt: list[int], clock: Callable[[], float] = time.perf_counter
) -> float:
    """Seconds of one prefill round of ``prompt``."""
    from roundgate.actors.control.config import PoolConfig
    from roundgate.actors.control.kv_pool import KVPool
    from roundgate.actors.control.request import Request, SamplingParams
    from roundgate.actors.control.round import RoundPlan, ScheduledChunk

    pool = KVPool(PoolConfig.from_args(runner.args))
    request = Request("p", prompt, SamplingParams(max_tokens=1))
    request.page_ids = pool.allocate("p", len(prompt))
    plan = RoundPlan(chunks=[ScheduledChunk(request, 0, len(prompt), True)])
    started = clock()
    runner.execute(plan)
    return clock() - started


# ---- a goodput matrix's runs ----------------------------------------------------------------


def run_record(cell: str, arm: str, seed: int, result: Any, slo: Any) -> dict[str, Any]:
    """One simulated arm of a goodput-matrix cell as the JSON line its ``--out`` file keeps:
    goodput under ``slo`` first, then the latency percentiles it was judged on."""
    from roundgate.sim.goodput import goodput
    from roundgate.sim.report import summarize

    summary = summarize(result)
    good = goodput(result, slo)
    return {
        "cell": cell,
        "arm": arm,
        "seed": seed,
        "goodput": good.requests_per_s,
        "good_fraction": good.fraction,
        "ttft_p50": summary["ttft_ms"]["p50"],
        "ttft_p99": summary["ttft_ms"]["p99"],
        "itl_p50": summary["itl_ms"]["p50"],
        "itl_p99": summary["itl_ms"]["p99"],
    }


def finished_runs(out: Path) -> set[tuple[str, str, int]]:
    """(cell, arm, seed) of every run already in ``out``: a rerun resumes after them."""
    if not out.exists():
        return set()
    runs = (json.loads(line) for line in out.read_text().splitlines())
    return {(r["cell"], r["arm"], r["seed"]) for r in runs}
