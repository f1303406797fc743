"""A DeepSeek-V2-Lite-shaped random model end to end on the offline Engine, for
``benchmarks/gpu_check.sh`` (CUDA; ``--device cpu --tiny`` runs it in seconds, for the test).

    python3 benchmarks/gpu_deepseek_lite.py [--out PATH] [--layers 3] [--prompts 16]
        [--prompt-len 64] [--max-tokens 64] [--device cuda|cpu] [--tiny]

1. The model: transformers' ``DeepseekV2ForCausalLM`` at DeepSeek-V2-Lite's widths (MLA with
   no q-LoRA, 64 routed experts top-6 plus 2 shared, the first layer dense) but ``--layers``
   layers (default 3: one dense, two MoE), random, saved with ``save_pretrained`` to a temp
   dir in bf16 (float32 on CPU). ``--tiny`` divides every width by about 16.
2. Each configuration: eager (``enforce_eager``), CUDA graphs, and each of those with
   ``async_scheduling`` (the overlap) where ``ServerArgs`` has that field; the default
   ``auto`` backends (on CUDA: the Triton MLA and Triton MoE kernels). One Engine per
   configuration runs a warm-up (kernels compiled, prompts in the prefix cache), then the
   timed batch: ``--prompts`` prompts of ``--prompt-len`` tokens, ``--max-tokens`` greedy
   tokens each.
3. Reported per configuration: decode tokens/s, whether its tokens equal the eager ones,
   whether decode graphs were captured (and why not), the backends ``auto`` gave, and the
   round's parts over the timed run's decode rounds (``RoundParts``: schedule, gather,
   forward, finish; the host's wall time of the round; on CUDA the GPU time of the
   executor's round from CUDA events around ``runner.execute``), each as median and p90 ms.

Prints one JSON document (and writes it to ``--out``). ``failures`` (a configuration that
raised, tokens unlike the eager ones, no round timed, on CUDA a backend ``auto`` did not
fuse) exit 1; ``skipped`` (the overlap missing from this tree, on CUDA graphs asked for but
not captured: no MoE backend is graph-safe yet) is printed loudly and exits 0;
``gpu_check.sh`` fails the check on either.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import math
import statistics
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from roundgate.actors.engine import Engine, SamplingParams
from roundgate.actors.server_args import ServerArgs

# DeepSeek-V2-Lite's config.json, less its depth (``--layers``) and YaRN (plain RoPE here).
V2_LITE: dict[str, Any] = {
    "vocab_size": 102400,
    "hidden_size": 2048,
    "intermediate_size": 10944,
    "num_attention_heads": 16,
    "num_key_value_heads": 16,
    "kv_lora_rank": 512,
    "q_lora_rank": None,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
    "n_routed_experts": 64,
    "n_shared_experts": 2,
    "num_experts_per_tok": 6,
    "moe_intermediate_size": 1408,
    "first_k_dense_replace": 1,
}
# Every width about 16x smaller (heads 4x, experts 16x with top-2): seconds on a CPU.
TINY: dict[str, Any] = {
    **V2_LITE,
    "vocab_size": 6400,
    "hidden_size": 128,
    "intermediate_size": 684,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "kv_lora_rank": 32,
    "qk_nope_head_dim": 8,
    "qk_rope_head_dim": 4,
    "v_head_dim": 8,
    "n_routed_experts": 4,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 88,
}
# name -> ServerArgs flags; ``async_scheduling`` only where the tree has it.
CONFIGS: dict[str, dict[str, bool]] = {
    "eager": {"enforce_eager": True},
    "graphs": {"enforce_eager": False},
    "eager_overlap": {"enforce_eager": True, "async_scheduling": True},
    "graphs_overlap": {"enforce_eager": False, "async_scheduling": True},
}
# What ``auto`` must give on CUDA: the Triton MLA kernel and the Triton experts.
FUSED = ("triton", "triton_run_experts")
NO_OVERLAP = "overlap: not available in this tree (ServerArgs has no async_scheduling)"
PAGE_SIZE = 16


def save_model(path: Path, layers: int, tiny: bool, device: str, seed: int = 0) -> int:
    """A seeded random DeepSeek-V2-Lite-shaped model saved to ``path``; its parameter count."""
    from transformers import DeepseekV2Config, DeepseekV2ForCausalLM

    config = DeepseekV2Config(
        **(TINY if tiny else V2_LITE),
        num_hidden_layers=layers,
        topk_method="greedy",
        norm_topk_prob=False,
        routed_scaling_factor=1.0,
        max_position_embeddings=4096,
        # Far from transformers' 0.02 default so top-1 logits have clear margins (as in
        # tests/model_driver.py): near-ties would make token equality a coin toss in bf16.
        initializer_range=0.2,
        bos_token_id=None,
        eos_token_id=None,  # no stop token: every prompt decodes all of --max-tokens
        pad_token_id=None,
    )
    torch.manual_seed(seed)
    with torch.device(device):  # initialized where it runs: seconds on a GPU, not minutes
        model = DeepseekV2ForCausalLM(config)
    model = model.to(torch.bfloat16 if device == "cuda" else torch.float32).eval()
    model.save_pretrained(path)
    count = sum(p.numel() for p in model.parameters())
    del model
    _release(device)
    return count


def make_prompts(count: int, length: int, vocab: int) -> list[list[int]]:
    """``count`` distinct fixed prompts of ``length`` tokens below ``vocab``."""
    gen = torch.Generator().manual_seed(1)
    return torch.randint(0, vocab, (count, length), generator=gen).tolist()


def has_overlap() -> bool:
    """Whether this tree's ``ServerArgs`` has ``async_scheduling`` (``--async-scheduling``)."""
    return "async_scheduling" in {f.name for f in dataclasses.fields(ServerArgs)}


class RoundTimer:
    """Records each round of an Engine: ``RankLoop.parts`` after every ``step`` and, on CUDA,
    a pair of CUDA events around each of the runner's ``execute`` (wrapped on the instances).

    The events are kept per ``execute``, apart from the steps: under the overlap the forward
    runs on a worker thread, a round behind the step that plans the next one.
    """

    def __init__(self, engine: Engine, cuda: bool) -> None:
        self.cuda = cuda
        self.rounds: list[dict[str, Any]] = []
        self.executes: list[tuple[bool, Any, Any]] = []  # (is_decode, start, end)
        loop, runner = engine.core.loop, engine.runner
        loop.step = self._timed_step(loop, loop.step)
        if cuda:
            runner.execute = self._timed_execute(runner.execute)

    def _timed_execute(self, execute: Callable[..., Any]) -> Callable[..., Any]:
        def timed(plan: Any, *args: Any, **kwargs: Any) -> Any:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            result = execute(plan, *args, **kwargs)
            end.record()
            self.executes.append((_is_decode(plan), start, end))
            return result

        return timed

    def _timed_step(self, loop: Any, step: Callable[[], Any]) -> Callable[[], Any]:
        def timed() -> Any:
            started = time.perf_counter()
            outcome = step()
            host = time.perf_counter() - started
            row = {
                **loop.parts.as_dict(),
                "host_round": host,
                "is_decode": _is_decode(outcome.plan),
            }
            self.rounds.append(row)
            return outcome

        return timed

    def summary(self) -> dict[str, Any]:
        """Median and p90 ms of each part over the decode rounds (read after a sync)."""
        decodes = [r for r in self.rounds if r["is_decode"]]
        parts: dict[str, Any] = {}
        for name in ("schedule", "gather", "forward", "finish", "host_round"):
            parts[name] = _stats([r[name] * 1e3 for r in decodes])
        gpu = [start.elapsed_time(end) for is_decode, start, end in self.executes if is_decode]
        parts["gpu_round"] = _stats(gpu) if self.cuda else None
        if gpu and decodes:  # the GPU's share of the decode rounds' wall time
            host = sum(r["host_round"] for r in decodes) * 1e3
            parts["gpu_busy_share"] = round(sum(gpu) / host, 3)
        return {
            "num_rounds": len(self.rounds),
            "num_decode_rounds": len(decodes),
            "num_gpu_timed_rounds": len(gpu),
            "ms": parts,
        }


def _is_decode(plan: Any) -> bool:
    """A round of decodes only (no prompt chunk), not an idle one."""
    return plan.batch_size > 0 and plan.num_extends == 0


def run_config(
    model: str, flags: dict[str, bool], prompts: list[list[int]], max_tokens: int, device: str
) -> tuple[dict[str, Any], list[list[int]]]:
    """One configuration's Engine: warm-up, the timed batch; its report and its tokens."""
    from roundgate.actors.model.decode_graphs import ineligibility

    pages_each = -(-(len(prompts[0]) + max_tokens) // PAGE_SIZE)
    args = ServerArgs(
        model=model,
        device=device,
        page_size=PAGE_SIZE,
        num_kv_pages=2 * len(prompts) * pages_each + 64,  # warm-up's cached pages + the batch
        max_num_seqs=max(len(prompts), 1),
        **flags,
    )
    engine = Engine(args)
    runner = engine.runner
    moe_safe = runner.moe is not None and runner.moe.is_graph_safe
    report: dict[str, Any] = {
        "flags": flags,
        "attention": runner.attention.name,
        "experts": runner.experts.__name__,
        "graphs_captured": runner.graphs is not None,
        "why_eager": ineligibility(
            runner.device.type,
            args.enforce_eager,
            runner.config.is_moe,
            runner.attention.name,
            moe_graph_safe=moe_safe,
        ),
    }
    # Warm-up: kernels compiled (and any graphs replayed), the prompts' pages cached, so the
    # timed run's prefill is one token a prompt: it times decoding.
    engine.generate(prompts, SamplingParams(max_tokens=4))
    _sync(device)
    timer = RoundTimer(engine, cuda=device == "cuda")
    started = time.perf_counter()
    outputs = engine.generate(prompts, SamplingParams(max_tokens=max_tokens))
    _sync(device)
    elapsed = time.perf_counter() - started
    generated = sum(len(o) for o in outputs)
    report |= {
        "generated_tokens": generated,
        "seconds": round(elapsed, 4),
        "decode_tokens_per_s": round(generated / elapsed, 1),
        "rounds": timer.summary(),
    }
    if runner.graphs is not None:
        report["graph_replays"] = runner.graphs.num_replays
    close = getattr(engine.core.loop, "close", None)  # the overlap's forward thread, if any
    if close is not None:
        close()
    del engine, runner, timer
    _release(device)
    return report, outputs


def failures_of(report: dict[str, Any], device: str) -> tuple[list[str], list[str]]:
    """``(failures, skipped)`` of a finished report's configurations."""
    failures, skipped = [], []
    for name, row in report["configs"].items():
        if "skipped" in row:
            skipped.append(f"{name}: {row['skipped']}")
        elif "error" in row:
            failures.append(f"{name}: raised {row['error']}")
        else:
            if not row["same_as_eager"]:
                failures.append(f"{name}: tokens differ from eager's ({row['first_mismatch']})")
            if device == "cuda" and (row["attention"], row["experts"]) != FUSED:
                failures.append(
                    f"{name}: auto gave attention {row['attention']}, experts "
                    f"{row['experts']}, not the fused {FUSED}"
                )
            rounds = row["rounds"]
            if rounds["num_decode_rounds"] == 0:
                failures.append(f"{name}: no decode round timed (RankLoop.step not reached)")
            elif device == "cuda" and rounds["num_gpu_timed_rounds"] == 0:
                failures.append(f"{name}: no CUDA events (runner.execute not reached)")
            wants_graphs = row["flags"]["enforce_eager"] is False
            if device == "cuda" and wants_graphs and not row["graphs_captured"]:
                skipped.append(f"{name}: no decode graphs captured: {row['why_eager']}")
    return failures, skipped


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--layers", type=int, default=3)
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--prompt-len", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--out", default=None)
    parser.add_argument("--tiny", action="store_true", help="every width ~16x smaller")
    ns = parser.parse_args(argv)
    if ns.device not in ("cuda", "cpu"):
        parser.error(f"--device must be cuda or cpu, got {ns.device}")
    if ns.layers < 2:
        parser.error("--layers must be >= 2 (one dense layer, then MoE)")
    shape = TINY if ns.tiny else V2_LITE
    report: dict[str, Any] = {
        "device": torch.cuda.get_device_name() if ns.device == "cuda" else "cpu",
        "torch": torch.__version__,
        "model": {
            "shape": "tiny" if ns.tiny else "DeepSeek-V2-Lite",
            "layers": ns.layers,
            "dtype": "bfloat16" if ns.device == "cuda" else "float32",
            **{k: shape[k] for k in ("hidden_size", "n_routed_experts", "kv_lora_rank")},
        },
        "batch": {
            "prompts": ns.prompts,
            "prompt_len": ns.prompt_len,
            "max_tokens": ns.max_tokens,
        },
        "overlap_available": has_overlap(),
        "configs": {},
    }
    prompts = make_prompts(ns.prompts, ns.prompt_len, shape["vocab_size"])
    expected: list[list[int]] | None = None
    with tempfile.TemporaryDirectory() as tmp:
        started = time.perf_counter()
        report["model"]["parameters"] = save_model(Path(tmp), ns.layers, ns.tiny, ns.device)
        report["model"]["build_s"] = round(time.perf_counter() - started, 2)
        for name, flags in CONFIGS.items():
            if "async_scheduling" in flags and not report["overlap_available"]:
                report["configs"][name] = {"flags": flags, "skipped": NO_OVERLAP}
                print(f"gpu_deepseek_lite: SKIPPED {name}: {NO_OVERLAP}", file=sys.stderr)
                continue
            started = time.perf_counter()
            try:
                row, outputs = run_config(tmp, flags, prompts, ns.max_tokens, ns.device)
            except Exception as exc:  # one configuration's failure is reported, not fatal
                traceback.print_exc()
                report["configs"][name] = {"flags": flags, "error": repr(exc)}
                _release(ns.device)
                continue
            if expected is None:  # the eager one, first
                expected = outputs
            row["same_as_eager"] = outputs == expected
            row["first_mismatch"] = _first_mismatch(outputs, expected)
            row["wall_s"] = round(time.perf_counter() - started, 2)
            report["configs"][name] = row
            print(f"gpu_deepseek_lite: {name}: {row['decode_tokens_per_s']} tok/s", file=sys.stderr)
    failures, skipped = failures_of(report, ns.device)
    report["failures"], report["skipped"] = failures, skipped
    report["note"] = (
        "decode_tokens_per_s: tokens generated over one Engine run of the batch, its prompts "
        "already in the prefix cache; rounds.ms: median/p90 over the timed run's decode "
        "rounds; gpu_round: CUDA events around runner.execute, host_round: the whole round"
    )
    text = json.dumps(report, indent=2)
    print(text)
    if ns.out:
        Path(ns.out).write_text(text + "\n")
    for line in skipped:
        print(f"gpu_deepseek_lite: SKIPPED {line}", file=sys.stderr)
    if failures:
        print("gpu_deepseek_lite FAILED:\n  " + "\n  ".join(failures), file=sys.stderr)
        return 1
    return 0


def _first_mismatch(outputs: list[list[int]], expected: list[list[int]]) -> str | None:
    for i, (got, want) in enumerate(zip(outputs, expected, strict=True)):
        if got != want:
            pairs = enumerate(zip(got, want, strict=False))
            at = next((j for j, (a, b) in pairs if a != b), min(len(got), len(want)))
            return f"prompt {i}, token {at}"
    return None


def _stats(values_ms: list[float]) -> dict[str, float] | None:
    """Median and p90 (nearest rank) of ``values_ms``, rounded to microseconds."""
    if not values_ms:
        return None
    ordered = sorted(values_ms)
    p90 = ordered[math.ceil(0.9 * len(ordered)) - 1]
    return {"median": round(statistics.median(ordered), 3), "p90": round(p90, 3)}


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def _release(device: str) -> None:
    """Free what the last model held (the wrapped methods make cycles: collect them)."""
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()


if __name__ == "__main__":
    sys.exit(main())
