"""P/D link throughput on this machine: pages/s, MB/s and per-request transfer latency.

Two processes join a real KV link (gloo over loopback, ``actors/replica/kv_link.py``); the
sender's cache has the served model's page layout (default: the default model's, float32,
page 16), and each "request" moves ``--prompt-len`` tokens' pages from random pages of the
sender's pool into random pages of the receiver's, exactly as ``send_kv`` / ``receive`` do
(gather into one tensor, header + payload, scatter into the reserved pages)::

    python benchmarks/bench_kv_link.py --prompt-len 256 --requests 200
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _peer(rank: int, init: str, ns: dict[str, Any], out: Any) -> None:
    import torch

    from roundgate.actors.model.resolve import resolve_model_config
    from roundgate.actors.replica.kv_link import KVLink, open_store
    from roundgate.kernels.attention.batch import PagedKVCache

    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    torch.set_num_threads(1)
    config = resolve_model_config(ns["model"])
    pages, page_size = ns["num_pages"], ns["page_size"]
    if config.mla is not None:
        cache = PagedKVCache.allocate_latent(
            config.num_layers, pages, page_size, config.mla.latent_width, torch.float32, "cpu"
        )
    else:
        cache = PagedKVCache.allocate(
            config.num_layers, pages, page_size, config.num_kv_heads, config.head_dim,
            torch.float32, torch.device("cpu"),
        )  # fmt: skip
    link = KVLink(open_store(init, 2, 60), rank, 2, "gloo", 60)
    rng = random.Random(ns["seed"])
    per_request = -(-ns["prompt_len"] // page_size)
    times, sizes = [], []
    for tag in range(1, ns["requests"] + 1):
        ids = rng.sample(range(pages), per_request)
        start = time.perf_counter()
        if rank == 0:
            sizes.append(link.send(cache, ids, 1, tag))
        else:
            sizes.append(link.receive(cache, ids, 0, tag))
        times.append(time.perf_counter() - start)
    out.put((rank, times, sizes, per_request, cache.bytes_per_token))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--prompt-len", type=int, default=256)
    p.add_argument("--page-size", type=int, default=16)
    p.add_argument("--num-pages", type=int, default=512)
    p.add_argument("--requests", type=int, default=200)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", type=Path, default=None)
    ns = vars(p.parse_args(argv))
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    init = f"file://{tempfile.mkdtemp(prefix='kv-link-bench-')}/store"
    json_path = ns.pop("json")
    procs = [ctx.Process(target=_peer, args=(r, init, ns, out)) for r in (0, 1)]
    for proc in procs:
        proc.start()
    results = dict((r[0], r[1:]) for r in (out.get(timeout=600) for _ in procs))
    for proc in procs:
        proc.join()
    times, sizes, per_request, bytes_per_token = results[1]  # the receiver: until KV written
    total_s, total_b = sum(times), sum(sizes)
    ordered = sorted(times)
    report = {
        **ns,
        "bytes_per_token": bytes_per_token,
        "pages_per_request": per_request,
        "bytes_per_request": sizes[0],
        "latency_ms_p50": round(1000 * statistics.median(times), 3),
        "latency_ms_p99": round(1000 * ordered[int(0.99 * (len(ordered) - 1))], 3),
        "pages_per_s": round(per_request * len(times) / total_s, 1),
        "mb_per_s": round(total_b / total_s / 1e6, 1),
    }
    print(json.dumps(report, indent=2))
    if json_path:
        json_path.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
