"""Per-token cost of a grammar's token mask on the default model's tokenizer (49,152 tokens).

For each library that imports (llguidance, xgrammar), a JSON-schema grammar walks a valid
output token by token: at each step the mask is computed, applied to a logits row, the best
allowed token (under fixed random logits) is taken and consumed. Reported: compile time and
the median microseconds per token of (mask + apply + consume).

    .venv/bin/python benchmarks/bench_grammar.py [--tokens 64] [--repeats 5]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

import torch

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer"},
        "tags": {"type": "array", "items": {"type": "string"}},
        "ok": {"type": "boolean"},
    },
    "required": ["name", "age", "tags", "ok"],
}


def walk(
    fill: Any, apply: Any, consume: Any, done: Any, vocab: int, tokens: int, seed: int
) -> list[float]:
    """Microseconds per token of computing the mask and consuming the token (the grammar's
    own work; applying the mask is timed apart, as the sampler applies it itself)."""
    gen = torch.Generator().manual_seed(seed)
    times = []
    for _ in range(tokens):
        if done():
            break
        logits = torch.randn(1, vocab, generator=gen)
        start = time.perf_counter()
        fill()
        elapsed = time.perf_counter() - start
        token = int(apply(logits).argmax())
        start = time.perf_counter()
        consume(token)
        times.append((elapsed + time.perf_counter() - start) * 1e6)
    return times


def bench_llguidance(hf_tok: Any, vocab: int, args: argparse.Namespace) -> dict[str, float]:
    import llguidance
    import llguidance.hf
    import llguidance.torch as lt

    start = time.perf_counter()
    tok = llguidance.hf.from_tokenizer(hf_tok, n_vocab=vocab)
    grammar = llguidance.LLMatcher.grammar_from_json_schema(json.dumps(SCHEMA))
    setup_s = time.perf_counter() - start
    per_token: list[float] = []
    compile_s = []
    for r in range(args.repeats):
        start = time.perf_counter()
        matcher = llguidance.LLMatcher(tok, grammar)
        compile_s.append(time.perf_counter() - start)
        mask = lt.allocate_token_bitmask(1, vocab)

        def fill(m: Any = matcher, b: torch.Tensor = mask) -> None:
            lt.fill_next_token_bitmask(m, b, 0)

        def apply(logits: torch.Tensor, b: torch.Tensor = mask) -> torch.Tensor:
            lt.apply_token_bitmask_inplace(logits, b)
            return logits

        per_token += walk(
            fill, apply, matcher.consume_token, matcher.is_stopped, vocab, args.tokens, seed=r
        )
    return {
        "tokenizer_setup_s": setup_s,
        "matcher_s": statistics.median(compile_s),
        "us_per_token": statistics.median(per_token),
    }


def bench_xgrammar(hf_tok: Any, vocab: int, args: argparse.Namespace) -> dict[str, float]:
    import xgrammar as xgr

    start = time.perf_counter()
    info = xgr.TokenizerInfo.from_huggingface(hf_tok, vocab_size=vocab)
    compiler = xgr.GrammarCompiler(info)
    setup_s = time.perf_counter() - start
    start = time.perf_counter()
    compiled = compiler.compile_json_schema(json.dumps(SCHEMA))
    compile_s = time.perf_counter() - start
    per_token: list[float] = []
    for r in range(args.repeats):
        matcher = xgr.GrammarMatcher(compiled)
        mask = xgr.allocate_token_bitmask(1, vocab)

        def fill(m: Any = matcher, b: torch.Tensor = mask) -> None:
            m.fill_next_token_bitmask(b)

        def apply(logits: torch.Tensor, b: torch.Tensor = mask) -> torch.Tensor:
            xgr.apply_token_bitmask_inplace(logits, b)
            return logits

        per_token += walk(
            fill, apply, matcher.accept_token, matcher.is_terminated, vocab, args.tokens, seed=r
        )
    return {
        "tokenizer_setup_s": setup_s,
        "matcher_s": compile_s,
        "us_per_token": statistics.median(per_token),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    from roundgate.actors.model.tokenizer import load_tokenizer

    tok = load_tokenizer("smollm2-135m-instruct")
    hf_tok, vocab = tok._tok, 49152
    for name, bench in (("llguidance", bench_llguidance), ("xgrammar", bench_xgrammar)):
        try:
            result = bench(hf_tok, vocab, args)
        except ImportError as exc:
            print(f"{name}: not installed ({exc})")
            continue
        print(name, {k: round(v, 4) for k, v in result.items()})


if __name__ == "__main__":
    main()
