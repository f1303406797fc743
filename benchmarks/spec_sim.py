"""Speculative decoding in the simulator: decode speed-up against SGLang's published figures,
and the gate with and without speculation at dp 8 and 128 (DeepSeek-V3 preset).

    PYTHONPATH=. .venv/bin/python benchmarks/spec_sim.py [--costs h100-dsv3] [--json out.json]

Part 1, the speed-up. SGLang publishes DeepSeek-V3's MTP at 1.8x decode speed at batch 1 and
1.5x at batch 32 (H200, TP8, ``../shared/SPECULATIVE.md``). One rank, a closed loop of 1 or 32
clients, 64-token prompts and 512-token answers, ``--policy none``; drafts priced as MTP's
(one draft step costs 1/61 of a decode forward: one decoder layer of the model's 61). The
table is output tokens/s with drafts over without, per draft count ``k`` and per-draft
acceptance rate ``a`` (drafts kept left to right until the first rejection). SGLang does not
publish its acceptance rate with those figures: the table says which ``a`` reproduces them.

Part 2, the gate. ``chat`` (230/200 tokens) at 80 % of ``none``'s saturation rate at dp=8
(``benchmarks/goodput_matrix_cells.py``; x16 at dp=128), open loop, under ``none``,
``roundgate`` (the fixed gate) and ``roundgate-auto``, each without drafts and with ``k`` = 2
at ``a`` = 0.7 (MTP priced as above): output tokens/s, TTFT p50, TPOT p50 (a request's
decode time over its tokens: a verification's tokens arrive together, so their gaps are 0
and ITL p50 says nothing), ITL p99 and goodput (TTFT <= 2 s, ITL p99 <= 200 ms). The
adaptive gate sees a verify round as the decode round it is (the round costs it prices are
fitted online from the rounds it measures); nothing in it counts the extra tokens a
verification yields.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace
from pathlib import Path

from roundgate.cli.main import build_parser
from roundgate.sim.goodput import Slo, goodput
from roundgate.sim.options import sim_specs
from roundgate.sim.report import summarize
from roundgate.sim.spec import simulate

MTP_SHARE = 1 / 61
SGLANG = {1: 1.8, 32: 1.5}
ACCEPTANCE = (0.6, 0.7, 0.8, 0.9)
DRAFTS = (1, 2, 3)
CHAT_RPS_DP8 = 34.0 * 0.8  # benchmarks/goodput_matrix_cells.py: SATURATION_RPS x "near"
SLO = Slo(2000.0, 200.0)


def run(argv: list[str]) -> dict:
    (spec,) = sim_specs(build_parser().parse_args(["simulate", *argv, "--no-progress"]))
    spec = replace(spec, itl_slo_ms=SLO.itl_ms)
    started = time.perf_counter()
    result = simulate(spec)
    summary = summarize(result)
    summary["goodput_rps"] = goodput(result, SLO).requests_per_s
    summary["wall_s"] = round(time.perf_counter() - started, 2)
    return summary


def spec_flags(k: int, a: float) -> list[str]:
    return ["--spec-tokens", str(k), "--spec-acceptance", str(a),
            "--spec-draft-share", str(MTP_SHARE)]  # fmt: skip


def speedups(costs: str) -> dict:
    out: dict = {}
    for batch in SGLANG:
        base = ["--costs", costs, "--dp-size", "1", "--max-num-seqs", "64", "--policy", "none",
                "--concurrency", str(batch), "--num-requests", str(2 * batch),
                "--input-len", "64", "--output-len", "512"]  # fmt: skip
        plain = run(base)["output_tokens_per_s"]
        out[batch] = {"plain_tok_s": plain}
        for k in DRAFTS:
            for a in ACCEPTANCE:
                drafted = run([*base, *spec_flags(k, a)])["output_tokens_per_s"]
                out[batch][f"k{k}/a{a}"] = drafted / plain
    return out


def gate(costs: str) -> dict:
    out: dict = {}
    for dp, scale in ((8, 1), (128, 16)):
        for policy in ("none", "roundgate", "roundgate-auto"):
            for arm, extra in (("no drafts", []), ("k=2 a=0.7", spec_flags(2, 0.7))):
                argv = ["--costs", costs, "--dp-size", str(dp),
                        "--max-num-seqs", str(64 * dp), "--policy", policy,
                        "--workload", "chat", "--rate", str(CHAT_RPS_DP8 * scale),
                        "--num-requests", str(400 * scale), *extra]  # fmt: skip
                out[f"dp{dp}/{policy}/{arm}"] = run(argv)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--costs", default="h100-dsv3")
    p.add_argument("--json", type=Path, default=None)
    ns = p.parse_args()
    ups = speedups(ns.costs)
    print("| batch | k | " + " | ".join(f"a={a}" for a in ACCEPTANCE) + " | SGLang |")
    print("|---|---|" + "---|" * (len(ACCEPTANCE) + 1))
    for batch, row in ups.items():
        for k in DRAFTS:
            cells = " | ".join(f"{row[f'k{k}/a{a}']:.2f}x" for a in ACCEPTANCE)
            print(f"| {batch} | {k} | {cells} | {SGLANG[batch]}x |", flush=True)
    gates = gate(ns.costs)
    print("\n| dp | policy | drafts | out tok/s | TTFT p50 ms | TPOT p50 ms | ITL p99 ms | "
          "goodput req/s |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    for key, s in gates.items():
        dp, policy, arm = key.split("/")
        print(
            f"| {dp[2:]} | {policy} | {arm} | {s['output_tokens_per_s']:.0f} | "
            f"{s['ttft_ms']['p50']:.0f} | {s['tpot_ms']['p50']:.1f} | {s['itl_ms']['p99']:.1f} | "
            f"{s['goodput_rps']:.2f} |",
            flush=True,
        )
    if ns.json is not None:
        ns.json.write_text(json.dumps({"speedups": ups, "gate": gates}, indent=2) + "\n")


if __name__ == "__main__":
    main()
