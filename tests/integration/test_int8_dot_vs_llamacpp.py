"""``--gguf-weights int8-dot`` against its reference, llama.cpp itself, on the default model's
GGUF, llama.cpp run from its own venv (``make llamacpp``: the xllamacpp package) with a float32
KV cache and without flash attention, one slot, one thread.

What is asserted:

- the int8-dot matrix product is ggml's own, bit for bit: our kernel against ``ggml_mul_mat``
  called in the library xllamacpp ships (``bench/ggml_ops.py``, in its own process), on
  the file's Q4_1 and Q8_0 tensors and on random Q4_0 blocks, 1 to 33 rows (x quantized to
  Q8_0/Q8_1 with the same f16 scales and sums, the same maddubs integer dots, the same float
  accumulation);
- the float operations between the products are ggml's too, bit for bit
  (``kernels/quant/ggml_arith.cpp``): RMSNorm times its weight, SwiGLU and RoPE against the
  same library's ops on random inputs of the model's shapes;
- free running, one request at a time (as llama.cpp's one slot serves them), our 32 greedy
  tokens equal llama.cpp's on at least 8 of the 10 prompts (the issue's bar; measured: 10 of
  10);
- teacher forcing, llama.cpp's own 32 tokens fed back one a round: our most likely token
  equals llama.cpp's at all 320 positions, and its log-probability is within 1e-3 of the one
  llama.cpp's server reports (measured: median 9.0e-5, max 2.9e-4: the logits are llama.cpp's
  bit for bit, but the server computes its probabilities with its own float softmax).

A batch of several sequences attends with ggml's batched summation order (as llama.cpp's
batch does); fed one token a round, each sequence's logits are llama.cpp's to the bit. Before
the float operations followed ggml's (torch's RMSNorm, RoPE, SwiGLU, attention), 4 to 6 of the
10 prompts held for 32 tokens: with activations quantized to 8 bits, one last-bit difference
can move a value across a rounding boundary of the next product's codes, and the runs drift
apart from there (``benchmarks/int8_dot_sensitivity.py`` measures that sensitivity).
"""

from __future__ import annotations

import json
import socket
import subprocess
import urllib.request
from collections.abc import Iterator

import gguf
import numpy as np
import pytest
import torch

from roundgate.actors.control.request import SamplingParams
from roundgate.actors.engine import Engine
from roundgate.actors.model.generation_config import read_generation_config
from roundgate.actors.model.gguf_file import packaged_path
from roundgate.actors.model.runner import ModelRunner
from roundgate.actors.model.tokenizer import load_tokenizer, stop_token_ids
from roundgate.actors.server_args import ServerArgs
from roundgate.bench import ggml_ops
from roundgate.bench.llamacpp import (
    LLAMACPP_PYTHON,
    LLAMACPP_VENV,
    MODEL,
    NEW_TOKENS,
    PROMPTS,
    llamacpp_command,
)
from roundgate.kernels import quant
from roundgate.kernels.attention.batch import build_attention_batch
from roundgate.kernels.quant import FORMATS, BlockWeights, block_linear, ggml_arith

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not quant.cpu_supports_kernel(), reason="needs AVX2/FMA/F16C"),
]


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


def test_the_float_operations_are_ggmls_bit_for_bit() -> None:
    """RMSNorm times its weight, SwiGLU and RoPE (ggml's mode 0 on the file's pairs; ours on
    the halves our Q and K are kept in) against the xllamacpp library's own ops."""
    library = ggml_ops.library_path(LLAMACPP_VENV)
    if library is None:
        pytest.fail(f"no xllamacpp library under {LLAMACPP_VENV}: run `make llamacpp`")
    config = ServerArgs(model=MODEL, device="cpu").model_config
    rng = np.random.default_rng(1)
    x = (rng.standard_normal((7, config.hidden_size)) * 3).astype(np.float32)
    weight = rng.standard_normal(config.hidden_size).astype(np.float32)
    gate, up = (rng.standard_normal((2, 5, config.intermediate_size)) * 4).astype(np.float32)
    dim = config.head_dim
    pairs = rng.standard_normal((6, config.num_heads, dim)).astype(np.float32)
    positions = np.array([0, 1, 5, 77, 300, 2047], np.int32)
    rope_params = np.array([dim, config.rope_theta, config.max_position], np.float64)
    cases = {
        "op_norm": np.array("rms_norm_mul"),
        "a_norm": x,
        "b_norm": weight,
        "kind_norm": np.array("F32"),
        "params_norm": np.array([config.rms_norm_eps]),
        "op_glu": np.array("swiglu"),
        "a_glu": gate,
        "b_glu": up,
        "kind_glu": np.array("F32"),
        "params_glu": np.zeros(0),
        "op_rope": np.array("rope"),
        "a_rope": pairs,
        "b_rope": positions,
        "kind_rope": np.array("F32"),
        "params_rope": rope_params,
    }
    theirs = ggml_ops.compute(library, cases)
    eps = config.rms_norm_eps
    ours = ggml_arith.rms_norm(torch.from_numpy(x), torch.from_numpy(weight), eps)
    assert np.array_equal(ours.numpy(), theirs["y_norm"])
    ours = ggml_arith.swiglu(torch.from_numpy(np.concatenate([gate, up], axis=-1)))
    assert np.array_equal(ours.numpy(), theirs["y_glu"])
    halves = torch.from_numpy(np.concatenate([pairs[..., 0::2], pairs[..., 1::2]], axis=-1))
    cos, sin = ggml_arith.rope_table(config.max_position, dim, config.rope_theta)
    index = torch.from_numpy(positions).long()
    rotated = ggml_arith.rope_(halves.clone(), cos[index], sin[index]).numpy()
    back = np.empty_like(pairs)
    back[..., 0::2], back[..., 1::2] = rotated[..., : dim // 2], rotated[..., dim // 2 :]
    assert np.array_equal(back, theirs["y_rope"])


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


def decode_logits(runner: ModelRunner, ids: list[int], forced: list[int]) -> list[torch.Tensor]:
    """Logits after ``ids`` and after each of ``forced`` fed one token a round (as
    llama.cpp's one slot decodes them: one-token batches attend as it does then)."""
    pages = list(range(-(-(len(ids) + len(forced)) // runner.args.page_size)))
    out, cached = [], 0
    with torch.inference_mode():
        for chunk in [ids, *([t] for t in forced[:-1])]:
            batch = build_attention_batch(
                [len(chunk)], [cached], [pages], runner.args.page_size, runner.device
            )
            logits = runner.forward_batch(torch.tensor(chunk), batch).float()[0]
            out.append(logits.clone())
            cached += len(chunk)
    return out


def test_int8_dot_follows_llamacpps_greedy_tokens(llamacpp_url: str) -> None:
    torch.set_num_threads(1)
    args = ServerArgs(
        model=MODEL, device="cpu", num_kv_pages=64, max_num_seqs=4, gguf_weights="int8-dot"
    )
    engine = Engine(args)
    assert engine.runner.weight_path == "int8-dot"
    assert engine.runner.attention.name == "ggml"  # llama.cpp's float arithmetic too
    tokenizer = load_tokenizer(MODEL)
    stops = stop_token_ids(engine.args.model_config, tokenizer, read_generation_config(MODEL))
    prompts = [tokenizer.encode(p) for p in PROMPTS]
    # Free running, one request at a time as llama.cpp's one slot serves them: ours stops at
    # the model's stop tokens, llama.cpp's ``tokens`` leaves its end-of-generation token out.
    equal = 0
    for ids in prompts:
        got = engine.generate([ids], SamplingParams(max_tokens=NEW_TOKENS, stop_token_ids=stops))
        want, _ = llamacpp_greedy(llamacpp_url, ids, ignore_eos=False)
        equal += got[0][: len(want)] == want and len(got[0]) - len(want) in (0, 1)
    # Teacher forcing: llama.cpp's 32 tokens (end-of-turn banned: ignore_eos) after each
    # prompt fed back one a round into a runner of our own (the engine's pages stay its own);
    # our likeliest token other than a stop token, and its log-probability, at each.
    runner = ModelRunner(args)
    agree, gaps = 0, []
    for ids in prompts:
        theirs, logprobs = llamacpp_greedy(llamacpp_url, ids, ignore_eos=True)
        assert len(theirs) == NEW_TOKENS
        for logits, token, lp in zip(
            decode_logits(runner, ids, theirs), theirs, logprobs, strict=True
        ):
            scores = torch.log_softmax(logits, dim=-1)
            allowed = scores.clone()
            allowed[list(stops)] = -torch.inf
            agree += int(allowed.argmax()) == token
            gaps.append(abs(float(scores[token]) - lp))
    print(
        f"int8-dot vs llama.cpp: free-running 32-token greedy equal on {equal}/10 prompts; "
        f"teacher-forced {agree}/{10 * NEW_TOKENS} top tokens equal (log-probability gap "
        f"median {np.median(gaps):.1e}, max {max(gaps):.1e})"
    )
    assert equal >= 8, f"free-running greedy equal on {equal} of 10 prompts"
    assert agree == len(prompts) * NEW_TOKENS, f"{agree} of {len(prompts) * NEW_TOKENS}"
    assert max(gaps) < 1e-3, max(gaps)
