"""llama.cpp's HTTP server on one GGUF file, run by the ``.venv-llamacpp`` interpreter.

    .venv-llamacpp/bin/python benchmarks/llamacpp_server.py MODEL.gguf --port 18766
        [--threads 2] [--parallel 8] [--ctx 4096] [--f32-cache] [--spec-ngram K]

The ``xllamacpp`` package (``make llamacpp``) wraps llama.cpp's server; this script only
fills its ``CommonParams``, prints ``ready`` once the server answers, and serves until it is
terminated. It imports nothing of roundgate (it runs in its own venv). ``--f32-cache``: float32
K/V and no flash attention, so llama.cpp's attention is float32 like ours (the reference of
the int8-dot weight path); without it, llama.cpp's defaults (f16 cache), as a user runs it.
``--spec-ngram K``: llama.cpp's own n-gram speculation (``ngram_simple``: the last 3 tokens
looked up in the context, ``K`` drafted), beside ours in ``benchmarks/speculative_live.py``.
"""

from __future__ import annotations

import argparse
import signal
import threading
import time
import urllib.request

import xllamacpp as xl


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("model")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--parallel", type=int, default=1, help="slots (concurrent requests)")
    parser.add_argument("--ctx", type=int, default=4096, help="context, shared by the slots")
    parser.add_argument("--f32-cache", action="store_true")
    parser.add_argument("--spec-ngram", type=int, default=0, help="n-gram drafts per step")
    args = parser.parse_args()
    params = xl.CommonParams()
    params.model.path = args.model
    params.n_parallel = args.parallel
    params.n_ctx = args.ctx
    params.cpuparams.n_threads = args.threads
    params.cpuparams_batch.n_threads = args.threads
    params.port = args.port
    params.hostnames = ["127.0.0.1"]
    params.cache_prompt = False  # every request computes its prompt, as ours does here
    if args.f32_cache:
        params.cache_type_k = xl.ggml_type.GGML_TYPE_F32
        params.cache_type_v = xl.ggml_type.GGML_TYPE_F32
        params.flash_attn_type = xl.llama_flash_attn_type.LLAMA_FLASH_ATTN_TYPE_DISABLED
    if args.spec_ngram:
        spec = params.speculative
        spec.types = [xl.common_speculative_type.COMMON_SPECULATIVE_TYPE_NGRAM_SIMPLE]
        spec.ngram_simple.size_n = 3
        spec.ngram_simple.size_m = args.spec_ngram
        spec.draft.n_max = args.spec_ngram
    server = xl.Server(params)
    url = f"http://127.0.0.1:{args.port}/health"
    for _ in range(600):
        try:
            with urllib.request.urlopen(url, timeout=1) as response:
                if response.status == 200:
                    break
        except OSError:
            time.sleep(0.1)
    print("ready", flush=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    stop.wait()
    del server


if __name__ == "__main__":
    main()
