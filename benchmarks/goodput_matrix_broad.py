"""Issue 49's broader goodput matrix: ``roundgate-auto`` against the fixed gate, judged on
cells held out from tuning.

    .venv/bin/python benchmarks/goodput_matrix_broad.py --set held-out --out out/broad.jsonl
    .venv/bin/python benchmarks/goodput_matrix_broad.py --set held-out --out out/broad.jsonl \
        --report

``benchmarks/goodput_matrix.py`` covers one cost preset, one chunk size and open-loop loads of
four workloads. This matrix varies what that one holds fixed, on a closed loop (the client
count is the load, so no preset needs its saturation rate measured first):

- **cost presets**: ``h100-dsv3``, ``gb200-dsv3`` (a 215 ms extend overhead: every window is
  slow) and ``gb200-qwen35-tep4`` (a 9.5 ms decode round);
- **chunk sizes** (``--max-scheduled-tokens``): 2,048, 8,192 and 16,384;
- **client counts** (at dp=8, scaled with the group): three per prompt range, from a few
  streams a rank to a full batch and past it;
- **prompt-length ranges**, uniform: ``short`` 64-512 (200 output tokens), ``mid`` 1k-4k
  (300), ``long`` 12k-40k (256) and ``reason`` 400-1,200 prompts with 1,500-token outputs;
- **speculative decoding** off, and ``kKaA`` (K MTP drafts, each kept with chance A, a draft
  step 1/61 of a decode forward): ``k1a0.8``, ``k2a0.7``, ``k3a0.6``, ``k4a0.9``.

The cells are 60 combinations fixed in the code (``_cells``): every preset x prompt range x
speculation setting, with the chunk size and client level rotating, and a dp=32 copy of six of
them. **TUNE** is every fourth cell (index % 4 == 0: 15 cells, plus the first dp=32 cell)
and the five held-out cells where ``roundgate-auto`` collapsed, traced round by round since
(``DIAGNOSED``: 21 cells); everything else is **HELD-OUT** (40 + 5 cells). Those 45 were
seen once, as a table, before the second round of changes. **FRESH** (``--set fresh``, 34
cells: ``_fresh_cells``) was fixed before any of its cells ran and is run once after the last
change: other chunk sizes and client counts, two other prompt ranges, other draft counts and
acceptances, dp=16, each preset and prompt range with and without speculation. Anything in
``roundgate-auto`` chosen while looking at this matrix was chosen on TUNE cells only.

Each cell runs ``none``, ``roundgate-auto`` (told the SLO) and the fixed gate over the tune
grid of ``goodput_matrix.py`` (ALL spacing 1, 2, 4, 8 x ANY spacing 4, 16, 64), one seed by
default (``--seeds``), ``2 x clients + 64`` requests at dp=8 (x dp/8 above it): bounded so
the held-out set runs in under 25 minutes on one core. The SLO per cell: TTFT within
``max(2 s, 3x`` the longest prompt's own prefill``)``, ITL p99 within ``max(200 ms, 1.2x``
one full chunk round``)`` (a stream beside a chunk round cannot do better), and
``roundgate-auto`` is told that SLO (``--prefill-auto-ttft-slo-ms``, ``--prefill-auto-itl-slo-ms``:
an operator states the SLO; the fixed gate gets its best pair of the grid instead). ``--report``
prints per cell auto/best-fixed and auto/none goodput and counts the cells within 5 %.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common import finished_runs, run_record

from roundgate.actors.server_args import ServerArgs
from roundgate.sim.goodput import Slo
from roundgate.sim.regimes import UniformPrompts
from roundgate.sim.round_costs import PRESETS
from roundgate.sim.spec import SimSpec, simulate
from roundgate.sim.speculation import SpecSim
from roundgate.sim.tune import candidates

AUTO = "roundgate-auto"
FIXED = "roundgate "  # label prefix of the tune grid's arms
# ``goodput_matrix.py``'s tune grid: the fixed gate's (ALL, ANY) spacings.
GRID = candidates("1,2,4,8", "4,16,64")
# One MTP draft step: one decoder layer of DeepSeek-V3's 61 (as ``goodput_matrix_cells``).
MTP_DRAFT_SHARE = 1 / 61
COST_PRESETS = ("h100-dsv3", "gb200-dsv3", "gb200-qwen35-tep4")
CHUNKS = (2048, 8192, 16384)
# (min prompt, max prompt, output tokens) and the client levels at dp=8 (a batch is 128 a rank).
PROMPTS: dict[str, tuple[int, int, int]] = {
    "short": (64, 512, 200),
    "mid": (1000, 4000, 300),
    "long": (12_000, 40_000, 256),
    "reason": (400, 1200, 1500),
}
CLIENTS: dict[str, tuple[int, int, int]] = {
    "short": (32, 256, 1536),
    "mid": (16, 96, 384),
    "long": (8, 32, 64),
    "reason": (16, 128, 512),
}
SPECS = ("", "k1a0.8", "k2a0.7", "k3a0.6", "k4a0.9")
# Indices into the dp=8 cells that also run at dp=32.
DP32_OF = (1, 7, 14, 26, 40, 53)
# Held-out cells where ``roundgate-auto`` collapsed (0.00-0.43x the best fixed gate, issue 49
# item 4): traced round by round to find why, so they count as TUNE cells from then on.
DIAGNOSED = frozenset(
    {
        "h100-dsv3/short/c8192/n256/dp8/k1a0.8",
        "h100-dsv3/short/c2048/n256/dp8/k3a0.6",
        "gb200-qwen35-tep4/mid/c8192/n384/dp8/k4a0.9",
        "gb200-qwen35-tep4/short/c2048/n1536/dp8/k2a0.7",
        "gb200-dsv3/mid/c16384/n384/dp8/k4a0.9",
    }
)


@dataclass(frozen=True)
class BroadCell:
    """One setup: cost preset, prompt range, chunk size, clients (at dp=8), speculation, dp."""

    preset: str
    prompts: str
    chunk: int
    clients: int
    spec: str = ""
    dp: int = 8

    @property
    def key(self) -> str:
        base = f"{self.preset}/{self.prompts}/c{self.chunk}/n{self.clients}/dp{self.dp}"
        return f"{base}/{self.spec}" if self.spec else f"{base}/off"

    @property
    def speculation(self) -> SpecSim | None:
        if not self.spec:
            return None
        k, a = self.spec[1:].split("a")
        return SpecSim(int(k), float(a), MTP_DRAFT_SHARE)

    @property
    def slo(self) -> Slo:
        costs = PRESETS[self.preset]
        _, longest, _ = PROMPT_RANGES[self.prompts]
        chunk = min(self.chunk, longest)
        round_ms = (
            costs.decode_base_ms
            + costs.extend_overhead_ms
            + costs.gather_ms
            + costs.prefill_per_token_ms * chunk
        )
        own_ms = math.ceil(longest / self.chunk) * round_ms
        return Slo(ttft_ms=max(2000.0, 3 * own_ms), itl_ms=max(200.0, 1.2 * round_ms))


def _cells() -> tuple[list[BroadCell], list[BroadCell]]:
    """(TUNE, HELD-OUT), fixed: see the module docstring."""
    base = []
    i = 0
    for preset in COST_PRESETS:
        for prompts in PROMPTS:
            for spec in SPECS:
                chunk = CHUNKS[i % len(CHUNKS)]
                clients = CLIENTS[prompts][(i // len(CHUNKS) + i) % 3]
                base.append(BroadCell(preset, prompts, chunk, clients, spec))
                i += 1
    tune = [c for i, c in enumerate(base) if i % 4 == 0]
    held = [c for i, c in enumerate(base) if i % 4 != 0]
    for n, i in enumerate(DP32_OF):
        c = base[i]
        big = BroadCell(c.preset, c.prompts, c.chunk, c.clients, c.spec, dp=32)
        (tune if n == 0 else held).append(big)
    # Held-out cells studied since (their runs traced to fix the gate) are tune cells now.
    tune += [c for c in held if c.key in DIAGNOSED]
    held = [c for c in held if c.key not in DIAGNOSED]
    return tune, held


# The FRESH held-out set (issue 49 item 4, second round): fixed before any of its cells ran,
# and run once, after the last change to ``roundgate-auto``. Everything differs from the
# cells above in at least two ways: a chunk size (4,096, 12,288) and client counts never
# used, two prompt ranges never used (``chat`` 128-2,048 with 400 output tokens, ``doc``
# 4k-12k with 200), speculation at other draft counts and acceptances, and dp=16.
FRESH_PROMPTS: dict[str, tuple[int, int, int]] = {
    "chat": (128, 2048, 400),
    "doc": (4000, 12_000, 200),
}
PROMPT_RANGES = PROMPTS | FRESH_PROMPTS
FRESH_CLIENTS: dict[str, tuple[int, int]] = {
    "short": (96, 768),
    "mid": (48, 192),
    "reason": (64, 256),
    "chat": (64, 640),
    "doc": (16, 96),
}
FRESH_CHUNKS = (4096, 12_288)
FRESH_SPECS = ("k2a0.85", "k3a0.8", "k1a0.6", "k4a0.75", "k2a0.5")
# Indices into the fresh dp=8 cells that also run at dp=16.
DP16_OF = (2, 9, 17, 24)


def _fresh_cells() -> list[BroadCell]:
    """FRESH: every preset x the five prompt ranges above, once without speculation and once
    with it (the k/acceptance pair, chunk and client level rotating), plus four at dp=16."""
    cells = []
    i = 0
    for preset in COST_PRESETS:
        for prompts in FRESH_CLIENTS:
            for spec in ("", FRESH_SPECS[i % len(FRESH_SPECS)]):
                chunk = FRESH_CHUNKS[(i // 2 + i) % len(FRESH_CHUNKS)]
                clients = FRESH_CLIENTS[prompts][(i // 3 + i) % 2]
                cells.append(BroadCell(preset, prompts, chunk, clients, spec))
                i += 1
    for i in DP16_OF:
        c = cells[i]
        cells.append(BroadCell(c.preset, c.prompts, c.chunk, c.clients, c.spec, dp=16))
    return cells


TUNE, HELD_OUT = _cells()
FRESH = _fresh_cells()
SETS = {"tune": TUNE, "held-out": HELD_OUT, "fresh": FRESH}


def run_arm(cell: BroadCell, arm: Arm, seed: int) -> dict[str, Any]:
    """One seeded closed-loop run of ``arm`` in ``cell``: goodput and latency percentiles."""
    scale = cell.dp // 8
    clients = cell.clients * scale
    lo, hi, out = PROMPT_RANGES[cell.prompts]
    requests = (2 * cell.clients + 64) * scale
    arrivals = UniformPrompts(requests, lo, hi, out, seed=seed).draw()
    args = ServerArgs(
        dp_size=cell.dp,
        max_num_seqs=128 * cell.dp,
        max_scheduled_tokens=cell.chunk,
        page_size=64,
        num_kv_pages=8192,
        enable_prefix_caching=False,
    )
    slo = cell.slo
    given = dict(arm.flags)
    if arm.policy == AUTO:  # the operator states the SLO; the fixed gate's grid is its tuning
        given |= {"prefill_auto_itl_slo_ms": slo.itl_ms, "prefill_auto_ttft_slo_ms": slo.ttft_ms}
    spec = SimSpec(
        args,
        arrivals,
        PRESETS[cell.preset],
        seed=seed,
        concurrency=clients,
        itl_slo_ms=slo.itl_ms,
        speculation=cell.speculation,
    ).with_policy(arm.policy, given)
    return run_record(cell.key, arm.label, seed, simulate(spec), slo)


@dataclass(frozen=True)
class Arm:
    """A policy at its simulate defaults, or the fixed gate at one (attempt, any) pair."""

    label: str
    policy: str
    flags: tuple[tuple[str, Any], ...] = ()


def _arms() -> list[Arm]:
    """``none``, ``roundgate-auto`` and the fixed gate at every pair of the grid."""
    fixed = [
        Arm(
            f"{FIXED}{attempt}/{any_}",
            "roundgate",
            (("prefill_attempt_interval", attempt), ("prefill_any_attempt_interval", any_)),
        )
        for attempt, any_ in GRID
    ]
    return [Arm("none", "none"), Arm(AUTO, AUTO), *fixed]


def _job(job: tuple[BroadCell, Arm, int]) -> dict[str, Any]:
    return run_arm(*job)


def run(ns: argparse.Namespace) -> None:
    done = finished_runs(ns.out)
    cells = SETS[ns.set]
    if ns.cells:
        cells = [c for c in cells if any(part in c.key for part in ns.cells)]
    jobs = [
        (cell, arm, seed)
        for cell in cells
        for seed in ns.seeds
        for arm in _arms()
        if (cell.key, arm.label, seed) not in done and (ns.only_auto is False or arm.label == AUTO)
    ]
    print(f"{len(jobs)} runs to do ({len(done)} already in {ns.out})", file=sys.stderr)
    ns.out.parent.mkdir(parents=True, exist_ok=True)
    with ns.out.open("a") as out, ProcessPoolExecutor(ns.workers) as pool:
        for i, record in enumerate(pool.map(_job, jobs, chunksize=1), 1):
            out.write(json.dumps(record) + "\n")
            out.flush()
            if i % 26 == 0:
                print(f"{i}/{len(jobs)} {record['cell']}", file=sys.stderr)


def report(ns: argparse.Namespace) -> None:
    records = [json.loads(line) for line in ns.out.read_text().splitlines()]
    keys = {c.key for c in SETS[ns.set]}
    grouped: dict[str, dict[str, list[dict]]] = {}
    for r in records:
        if r["cell"] in keys:
            grouped.setdefault(r["cell"], {}).setdefault(r["arm"], []).append(r)
    print("| cell | auto | best fixed (pair) | none | auto/fixed | auto/none | auto ITL p99 |")
    print("|" + " --- |" * 7)
    within = above_none = total = 0
    for cell in sorted(grouped):
        res = {arm: _mean(rs) for arm, rs in grouped[cell].items()}
        if AUTO not in res or "none" not in res:
            continue
        fixed = {a: r for a, r in res.items() if a.startswith(FIXED)}
        best = max(fixed, key=lambda a: fixed[a]["goodput"])
        auto, none, top = res[AUTO]["goodput"], res["none"]["goodput"], fixed[best]["goodput"]
        vs_fixed = auto / top if top else 1.0
        vs_none = auto / none if none else 1.0
        total += 1
        within += vs_fixed >= 0.95
        # Equal runs differ in the last digits (the clock's float sums): a tie is not a miss.
        ok_none = auto >= none * (1 - 1e-4)
        above_none += ok_none
        flag = "" if vs_fixed >= 0.95 and ok_none else " **miss**"
        print(
            f"| {cell} | {auto:.3f} | {top:.3f} ({best[len(FIXED) :]}) | {none:.3f} | "
            f"{vs_fixed:.2f}x | {vs_none:.2f}x | {res[AUTO]['itl_p99']:.0f}{flag} |"
        )
    print(
        f"\n{ns.set}: {within}/{total} cells within 5 % of the best fixed gate, "
        f"{above_none}/{total} at or above none"
    )


def _mean(rs: list[dict]) -> dict[str, float]:
    metrics = ("goodput", "good_fraction", "ttft_p50", "ttft_p99", "itl_p50", "itl_p99")
    return {m: statistics.fmean(r[m] for r in rs if r[m] is not None) for m in metrics}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True, help="JSON lines, appended and resumed")
    p.add_argument("--set", choices=tuple(SETS), required=True, help="TUNE, HELD-OUT or FRESH")
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--seeds", type=lambda s: [int(v) for v in s.split(",")], default=[0])
    p.add_argument("--cells", type=lambda s: s.split(","), default=None, help="key substrings")
    p.add_argument("--only-auto", action="store_true", help="rerun roundgate-auto's arm only")
    p.add_argument("--report", action="store_true", help="print the table from --out")
    ns = p.parse_args(argv)
    report(ns) if ns.report else run(ns)


if __name__ == "__main__":
    main()
