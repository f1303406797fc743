"""Writes this folder's nccl-tests samples: made-up runs in the text format nccl-tests prints.

Why generated: the parser tests must run in a fresh clone, without ``../shared``'s real logs,
and a small model (latency + size / bandwidth, a fixed-seed jitter) makes every number in the
tables consistent (algbw = size / time, busbw = algbw x the collective's bus factor, the footer
= the mean busbw over every row and both halves), which is what the parser and the verdict
read. Rerun with ``python tests/data/nccl-tests/make_samples.py`` after changing a spec; the
tests assert the values these files hold, so update ``tests/nccl_samples.py`` with them.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
COLUMNS = (
    "#                                                              out-of-place"
    "                       in-place\n"
    "#       size         count      type   redop    root     time   algbw   busbw #wrong"
    "     time   algbw   busbw #wrong\n"
    "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)"
    "            (us)  (GB/s)  (GB/s)\n"
)


@dataclass(frozen=True)
class Spec:
    """One run: the collective, the ranks (host, device name) and the fabric model."""

    name: str
    collective: str  # "all_gather" or "all_reduce"
    hosts: tuple[str, ...]
    gpus_per_host: int
    device: str
    min_bytes: int
    max_bytes: int
    latency_us: float
    peak_gbps: float  # algbw the largest sizes approach
    seed: int
    modern: bool = True  # prints the nccl-tests version and the starting/concluded lines
    validation: bool = True
    wrong_at: dict[int, int] | None = None  # size -> wrong elements (out-of-place)
    truncate_after: int | None = None  # stop after this size: no footer (a crashed run)
    prefix: str = ""  # a launcher's per-line prefix, e.g. srun -l's "0: "
    chatter: tuple[str, ...] = ()

    @property
    def num_ranks(self) -> int:
        return len(self.hosts) * self.gpus_per_host


def fmt_time(us: float) -> str:
    if us < 100:
        return f"{us:7.2f}"
    return f"{us:7.1f}" if us < 10000 else f"{us:7.0f}"


def rows(spec: Spec) -> tuple[list[str], list[float]]:
    """The table rows and every printed busbw (as printed), for the footer's mean."""
    rng = random.Random(spec.seed)
    n = spec.num_ranks
    factor = (n - 1) / n if spec.collective == "all_gather" else 2 * (n - 1) / n
    redop = "none" if spec.collective == "all_gather" else "sum"
    out, busbws = [], []
    size = spec.min_bytes
    while size <= spec.max_bytes:
        # all_gather trims the per-rank bytes to a multiple of 16 (tiny sizes print as 0)
        gather = spec.collective == "all_gather"
        num_bytes = size // n // 16 * 16 * n if gather else size // 4 * 4
        count = num_bytes // 4 // (n if spec.collective == "all_gather" else 1)
        cells = []
        for half in ("oop", "ip"):
            if num_bytes == 0:
                time_us = 0.05 + 0.01 * rng.random()
                algbw = busbw = 0.0
            else:
                model = spec.latency_us + num_bytes / (spec.peak_gbps * 1e3)
                time_us = float(fmt_time(model * rng.uniform(0.97, 1.05)))
                algbw = float(f"{num_bytes / time_us / 1e3:.2f}")
                busbw = float(f"{algbw * factor:.2f}")
            wrong = (spec.wrong_at or {}).get(size, 0) if half == "oop" else 0
            wrong_text = f"{wrong:g}" if spec.validation else "N/A"
            cells.append(f"  {fmt_time(time_us)}  {algbw:6.2f}  {busbw:6.2f}  {wrong_text:>5}")
            busbws.append(busbw)
        head = f"{num_bytes:12d}  {count:12d}  {'float':>8}  {redop:>6}  {-1:6d}"
        out.append(head + "".join(cells))
        if size == spec.truncate_after:
            break
        size *= 2
    return out, busbws


def render(spec: Spec) -> str:
    lines = list(spec.chatter)
    perf = f"{spec.collective}_perf"
    if spec.modern:
        lines += ["# nccl-tests version 2.17.6 nccl-headers=22703 nccl-library=22703"]
        lines += [f"# Collective test starting: {perf}"]
    lines.append(
        f"# nThread 1 nGpus 1 minBytes {spec.min_bytes} maxBytes {spec.max_bytes} step: 2(factor)"
        f" warmup iters: 5 iters: 20 agg iters: 1 validation: {int(spec.validation)} graph: 0"
    )
    lines += ["#", "# Using devices"]
    rank = 0
    for host_index, host in enumerate(spec.hosts):
        for device in range(spec.gpus_per_host):
            pid = 4100 + 37 * host_index + device
            bus = f"0000:{0x18 + 0x20 * device:02x}:00"
            lines.append(
                f"#  Rank {rank:2d} Group  0 Pid {pid:6d} on {host:>10} device {device:2d}"
                f" [{bus}] {spec.device}"
            )
            rank += 1
    if spec.modern:
        lines.append("NCCL version 2.27.3+cuda12.9")
    lines.append("#")
    lines += COLUMNS.rstrip("\n").split("\n")
    table, busbws = rows(spec)
    lines += table
    if spec.truncate_after is None:
        mean = sum(busbws) / len(busbws)
        lines += ["# Out of bounds values : 0 OK", f"# Avg bus bandwidth    : {mean:g}", "#"]
        if spec.modern:
            lines.append(f"# Collective test concluded: {perf}")
    return "".join(f"{spec.prefix}{line}\n" for line in lines)


SPECS = (
    Spec(  # healthy all_gather on one node, modern format: the calibration's input
        "allgather_4gpu_ok.txt",
        "all_gather",
        ("gpu-node-a",),
        4,
        "NVIDIA H100 80GB HBM3",
        8,
        256 << 20,
        9.0,
        140.0,
        seed=11,
    ),
    Spec(  # healthy all_reduce over two hosts, old format (no collective name printed)
        "allreduce_2host_ok.txt",
        "all_reduce",
        ("rdma-0", "rdma-1"),
        1,
        "NVIDIA A100-SXM4-80GB",
        1024,
        512 << 20,
        28.0,
        22.0,
        seed=23,
        modern=False,
        chatter=(
            "+ mpirun -np 2 --bind-to none /opt/nccl-tests/build/all_reduce_perf -b 1K -e 512M"
            " -f 2 -g 1",
            "Warning: Permanently added 'rdma-1' (ED25519) to the list of known hosts.",
        ),
    ),
    Spec(  # corrupted data and a crash: wrong elements at three sizes, no footer
        "allreduce_8gpu_wrong.txt",
        "all_reduce",
        ("node-x", "node-y"),
        4,
        "NVIDIA L40S",
        64,
        64 << 20,
        45.0,
        18.0,
        seed=37,
        prefix="0: ",
        wrong_at={4096: 12, 1 << 20: 2048, 16 << 20: 1_734_512},
        truncate_after=32 << 20,
    ),
    Spec(  # validation off (-c 0): every #wrong is N/A
        "allgather_2gpu_novalid.txt",
        "all_gather",
        ("box",),
        2,
        "NVIDIA RTX 4090",
        256,
        4 << 20,
        6.5,
        20.0,
        seed=5,
        validation=False,
    ),
)


def main() -> None:
    for spec in SPECS:
        (HERE / spec.name).write_text(render(spec), encoding="utf-8")


if __name__ == "__main__":
    main()
