"""The sampler's share of a decode round at batch 32 on the default model.

Two runs over the same ragged prompts: every transform off (greedy), and penalties
(presence, frequency, repetition) + logprobs (top 5) + a JSON-schema grammar + seeded
temperature sampling on every row. Each decode round is timed in two parts, the forward
(``ModelRunner.forward``) and the sampler (``sample_round``: transforms, grammar masks and
matcher updates, logprobs, the pick); reported are the medians and the sampler's share of the
round (target: at most 10 % with everything on).

    .venv/bin/python benchmarks/bench_sampler.py [--batch 32] [--rounds 24] [--threads 1]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from roundgate.actors.control.config import PoolConfig
from roundgate.actors.control.kv_pool import KVPool
from roundgate.actors.control.request import Request, SamplingParams
from roundgate.actors.control.round import RoundPlan, ScheduledChunk
from roundgate.actors.model.generation_config import read_generation_config
from roundgate.actors.model.round_sampling import sample_round
from roundgate.actors.model.runner import ModelRunner
from roundgate.actors.model.tokenizer import load_tokenizer, stop_token_ids
from roundgate.actors.server_args import ServerArgs

MODEL = "smollm2-135m-instruct"
SCHEMA = {
    "type": "object",
    "properties": {
        "items": {"type": "array", "items": {"type": "string"}, "minItems": 30},
    },
    "required": ["items"],
}


def run(runner: ModelRunner, prompts: list[list[int]], sampling: SamplingParams, rounds: int):
    """(forward seconds, sampler seconds, batch size) of each decode round."""
    pool = KVPool(PoolConfig.from_args(runner.args))
    requests = [Request(f"r{i}", p, sampling) for i, p in enumerate(prompts)]
    for r in requests:
        r.page_ids = pool.allocate(r.request_id, r.num_prompt_tokens + rounds + 1)
    plan = RoundPlan(chunks=[ScheduledChunk(r, 0, r.num_tokens, True) for r in requests])
    out = []
    for _ in range(rounds + 1):
        live = [c.request for c in plan.chunks]
        started = time.perf_counter()
        logits = runner.forward(plan)
        forward_s = time.perf_counter() - started
        started = time.perf_counter()
        sampled, logprobs, _ = sample_round(logits, live, runner.generator, runner.grammars)
        sample_s = time.perf_counter() - started
        if plan.num_extends == 0:
            out.append((forward_s, sample_s, len(live)))
        for chunk in plan.chunks:
            r = chunk.request
            r.num_computed_tokens = chunk.end
            if r.request_id in logprobs:
                r.output_logprobs.append(logprobs[r.request_id])
            r.append_token(sampled[r.request_id])
        live = [r for r in requests if not r.is_finished]
        if not live:
            break
        plan = RoundPlan(chunks=[ScheduledChunk(r, r.num_tokens - 1, 1, False) for r in live])
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=24)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    runner = ModelRunner(ServerArgs(model=MODEL, device="cpu", num_kv_pages=2048, page_size=16))
    tok = load_tokenizer(MODEL)
    stops = stop_token_ids(runner.config, tok, read_generation_config(MODEL))
    gen = torch.Generator().manual_seed(0)
    lengths = torch.randint(64, 257, (args.batch,), generator=gen).tolist()
    prompts = [torch.randint(0, 49152, (n,), generator=gen).tolist() for n in lengths]
    off = SamplingParams(max_tokens=args.rounds + 1, stop_token_ids=stops)
    on = SamplingParams(
        max_tokens=args.rounds + 1,
        stop_token_ids=stops,
        temperature=0.8,
        seed=1,
        presence_penalty=0.5,
        frequency_penalty=0.5,
        repetition_penalty=1.1,
        logprobs=5,
        grammar=("json_schema", json.dumps(SCHEMA)),
    )
    runner.grammars.compile(on.grammar)  # compiled at submit in serving, not in the round
    for name, sampling in (("off", off), ("on", on), ("off", off), ("on", on)):
        rows = run(runner, prompts, sampling, args.rounds)
        forward = statistics.median(f for f, _, _ in rows) * 1e3
        sampler = statistics.median(s for _, s, _ in rows) * 1e3
        batch = statistics.mean(b for _, _, b in rows)
        share = sampler / (forward + sampler) * 100
        print(
            f"{name:>3}: forward {forward:7.1f} ms  sampler {sampler:6.2f} ms  "
            f"share {share:4.1f} %  (mean batch {batch:.1f}, {len(rows)} rounds)"
        )


if __name__ == "__main__":
    main()
