"""``--gguf-weights int8-dot`` against its reference, llama.cpp itself, on the default model's
GGUF, llama.cpp run from its own venv (``make llamacpp``: the xllamacpp package) with a float32
KV cache and without flash attention.

What is asserted:

- the int8-dot matrix product is ggml's own, bit for bit: our kernel against ``ggml_mul_mat``
  called in the library xllamacpp ships (``benchmarks/ggml_ops.py``, in its own process), on
  the file's Q4_1 and Q8_0 tensors and on random Q4_0 blocks, 1 to 33 rows (x quantized to
  Q8_0/Q8_1 with the same f16 scales and sums, the same maddubs integer dots, the same float
  accumulation);
- with llama.cpp's own 32 greedy tokens fed back (teacher forcing), our int8-dot model's most
  likely token equals llama.cpp's at >= 95% of the 320 positions (measured: 312; the end-of-
  turn token, which llama.cpp's ``ignore_eos`` bans, is left out of ours as well).

What is measured, not asserted: free-running greedy tokens equal llama.cpp's for all 32 tokens
on 4 to 6 of the 10 prompts (6 in the last runs), where the issue asked for 8; the others part
at near-ties (both models' top-two margins 0.02 to 0.24 nats there). Matching the matrix
products cannot get further: every other operation would have to match ggml's to the last bit,
and none does. ``benchmarks/int8_dot_sensitivity.py`` measures both halves of that:

- quantizing activations to 8 bits makes the forward chaotic. Our own int8-dot model with
  RMSNorm's mean of squares summed in float64 instead of float32 (activations at most an ulp or
  so apart) gives the same 32 tokens as unperturbed on 3 of the 10 prompts and moves the
  per-position log-probabilities by a median 2.0e-2 (p90 8.8e-2); the exact path under the same
  nudge: 10 of 10, and 1e-6. The gap between our int8-dot model and llama.cpp's is that size
  (median 2.3e-2, p90 9.4e-2; our exact path against llama.cpp's int8 tokens: 2.5e-2), so no
  structural difference is left to find: a last-bit difference moves an activation across a
  rounding boundary now and then, which changes the next layer's inputs by 1/127 of a block's
  range and flips many more roundings, until the two runs' quantization noise is unrelated.
  llama.cpp does not agree with itself under such a nudge either (f16 vs f32 KV cache: 6 of 10);
- every operation between the products differs from ggml's in the last bits on a large share
  of elements (through the same library, random inputs of the model's shapes): RMSNorm 13%
  (ggml sums the squares in double), SwiGLU 25% (ggml's own exp approximation), softmax 64%
  (the same exp, a double sum), RoPE 59% (ggml's angles are an iterated float product), the
  float32 attention products 84% (another summation order). Following them would mean
  reimplementing ggml's CPU graph, exp approximation and attention included, not the kernel.

Teacher forcing compares one step at a time, so one flip cannot cascade; for the same reason it
does not single out the int8 arithmetic (our exact path scores about the same against
llama.cpp's int8 tokens): what it guards is that the int8-dot model as a whole, prefill and
decode, stays llama.cpp's model.
"""

from __future__ import annotations

import json
import socket
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch

from actors.control.request import Request, SamplingParams
from actors.engine import Engine
from actors.model.generation_config import read_generation_config
from actors.model.gguf_file import packaged_path
from actors.model.tokenizer import load_tokenizer, stop_token_ids
from actors.server_args import ServerArgs
from benchmarks import ggml_ops
from benchmarks.int8_dot_sensitivity import NEW_TOKENS, PROMPTS
from benchmarks.vs_llamacpp import llamacpp_command
from kernels import quant
from kernels.quant import FORMATS, BlockWeights, block_linear

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not quant.cpu_supports_kernel(), reason="needs AVX2/FMA/F16C"),
]
REPO = Path(__file__).resolve().parents[2]
LLAMACPP_VENV = REPO / ".venv-llamacpp"
LLAMACPP_PYTHON = LLAMACPP_VENV / "bin" / "python"
MODEL = "smollm2-135m-instruct"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ggml_cases() -> dict[str, np.ndarray]:
    """``ggml_ops`` cases: the file's Q4_1 projections and Q8_0 embedding (the tied output
    head; its first 4096 rows), random Q4_0 blocks (the file has none), each against 1, 3, 8
    and 33 rows of x."""
    reader = gguf.GGUFReader(packaged_path(MODEL))
    tensors = {t.name: t for t in reader.tensors}
    rng = np.random.default_rng(0)
    weights = {
        "attn_q": np.array(tensors["blk.0.attn_q.weight"].data, np.uint8),
        "ffn_down": np.array(tensors["blk.5.ffn_down.weight"].data, np.uint8),
        "output": np.array(tensors["token_embd.weight"].data[:4096], np.uint8),
    }
    kinds = {"attn_q": "Q4_1", "ffn_down": "Q4_1", "output": "Q8_0", "random": "Q4_0"}
    q4_0 = np.zeros((97, 5, 18), np.uint8)
    q4_0[..., :2] = (rng.random((97, 5, 1)) * 0.02).astype(np.float16).view(np.uint8)
    q4_0[..., 2:] = rng.integers(0, 256, (97, 5, 16), dtype=np.uint8)
    weights["random"] = q4_0.reshape(97, -1)
    cases: dict[str, np.ndarray] = {}
    for name, raw in weights.items():
        k = raw.shape[1] // FORMATS[kinds[name]].block_bytes * quant.BLOCK
        for rows in (1, 3, 8, 33):
            x = rng.standard_normal((rows, k)).astype(np.float32)
            x[rng.random((rows, k)) < 0.01] *= 20  # a few outliers set some blocks' scales
            c = f"{name}_{rows}"
            cases |= {f"op_{c}": np.array("mul_mat"), f"a_{c}": raw, f"b_{c}": x}
            cases |= {f"kind_{c}": np.array(kinds[name]), f"params_{c}": np.zeros(0)}
    return cases


def test_the_int8_dot_product_is_ggmls_bit_for_bit() -> None:
    library = ggml_ops.library_path(LLAMACPP_VENV)
    if library is None:
        pytest.fail(f"no xllamacpp library under {LLAMACPP_VENV}: run `make llamacpp`")
    cases = ggml_cases()
    theirs = ggml_ops.compute(library, cases)
    torch.set_num_threads(1)
    for c in (key[len("op_") :] for key in cases if key.startswith("op_")):
        x = torch.from_numpy(cases[f"b_{c}"])
        fmt = FORMATS[str(cases[f"kind_{c}"])]
        weights = BlockWeights(torch.from_numpy(cases[f"a_{c}"]), fmt, x.shape[1])
        ours = block_linear(x, weights, int8_dot=True).numpy()
        assert np.array_equal(ours, theirs[f"y_{c}"]), c


@pytest.fixture(scope="module")
def llamacpp_url() -> Iterator[str]:
    if not LLAMACPP_PYTHON.exists():
        pytest.fail(f"{LLAMACPP_PYTHON} is missing: run `make llamacpp`")
    port = free_port()
    server = subprocess.Popen(
        llamacpp_command(port, threads=1, f32_cache=True),
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert server.stdout is not None and server.stdout.readline().strip() == "ready"
        yield f"http://127.0.0.1:{port}"
    finally:
        server.terminate()
        server.wait(timeout=30)


def llamacpp_greedy(url: str, ids: list[int], ignore_eos: bool) -> tuple[list[int], list[float]]:
    """llama.cpp's greedy tokens after ``ids`` and the log-probability of each."""
    body = {
        "prompt": ids,
        "n_predict": NEW_TOKENS,
        "temperature": 0.0,
        "cache_prompt": False,
        "return_tokens": True,
        "ignore_eos": ignore_eos,
        "n_probs": 1,
    }
    request = urllib.request.Request(
        f"{url}/completion", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=120) as response:
        answer = json.load(response)
    return list(answer["tokens"]), [p["logprob"] for p in answer["completion_probabilities"]]


def test_int8_dot_follows_llamacpps_greedy_tokens(llamacpp_url: str) -> None:
    torch.set_num_threads(1)
    engine = Engine(
        ServerArgs(
            model=MODEL, device="cpu", num_kv_pages=64, max_num_seqs=4, gguf_weights="int8-dot"
        )
    )
    assert engine.runner.weight_path == "int8-dot"
    tokenizer = load_tokenizer(MODEL)
    stops = stop_token_ids(engine.args.model_config, tokenizer, read_generation_config(MODEL))
    prompts = [tokenizer.encode(p) for p in PROMPTS]
    # Teacher forcing: llama.cpp's 32 tokens (end-of-turn banned: ignore_eos) after each
    # prompt, and our likeliest token other than a stop token at each of those positions.
    agree, gaps = 0, []
    for i, ids in enumerate(prompts):
        theirs, logprobs = llamacpp_greedy(llamacpp_url, ids, ignore_eos=True)
        assert len(theirs) == NEW_TOKENS
        request = Request(f"tf{i}", ids + theirs, SamplingParams(max_tokens=1, prompt_logprobs=2))
        engine.run([request])
        scored = request.prompt_logprobs[len(ids) - 1 :]
        ours = [next(t for t in entry.top_ids if t not in stops) for entry in scored]
        agree += sum(a == b for a, b in zip(ours, theirs, strict=True))
        gaps += [abs(entry.logprob - lp) for entry, lp in zip(scored, logprobs, strict=True)]
    # Free running, reported: ours stops at the model's stop tokens, llama.cpp's ``tokens``
    # leaves its end-of-generation token out.
    free = engine.generate(prompts, SamplingParams(max_tokens=NEW_TOKENS, stop_token_ids=stops))
    equal = 0
    for ids, got in zip(prompts, free, strict=True):
        want, _ = llamacpp_greedy(llamacpp_url, ids, ignore_eos=False)
        equal += got[: len(want)] == want and len(got) - len(want) in (0, 1)
    print(
        f"int8-dot vs llama.cpp: teacher-forced {agree}/{10 * NEW_TOKENS} top tokens equal "
        f"(log-probability gap median {np.median(gaps):.1e}, max {max(gaps):.1e}), "
        f"free-running 32-token greedy equal on {equal}/10 prompts"
    )
    assert agree >= 0.95 * len(prompts) * NEW_TOKENS, f"{agree} of {len(prompts) * NEW_TOKENS}"
