"""llama.cpp as the CPU engine's reference: its server, run from its own venv, and the prompts
the comparisons decode.

``make llamacpp`` builds ``.venv-llamacpp`` with the ``xllamacpp`` package (llama.cpp and ggml
statically linked); its server runs there (``benchmarks/llamacpp_server.py``), never in a
process with torch, and ggml's own operations are called in its library by
``roundgate.bench.ggml_ops``. ``benchmarks/vs_llamacpp.py`` compares throughput against it and
``tests/integration/test_int8_dot_vs_llamacpp.py`` the int8-dot weight path's tokens.
"""

from __future__ import annotations

from pathlib import Path

from roundgate.actors.model.gguf_file import packaged_path

REPO = Path(__file__).resolve().parents[1]
LLAMACPP_VENV = REPO / ".venv-llamacpp"
LLAMACPP_PYTHON = LLAMACPP_VENV / "bin" / "python"
SERVER_SCRIPT = REPO / "benchmarks" / "llamacpp_server.py"
MODEL = "smollm2-135m-instruct"  # the default model, whose GGUF both engines load

# Greedy tokens per prompt, and the prompts, of the token-by-token comparisons.
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


def llamacpp_command(
    port: int,
    threads: int,
    slots: int | None = None,
    f32_cache: bool = False,
    spec_ngram: int = 0,
    ctx_per_slot: int = 512,
) -> list[str]:
    """llama.cpp's server (``llamacpp_server.py`` in its own venv) on the default model's GGUF:
    ``slots`` concurrent requests with ``ctx_per_slot`` tokens of context each (None: the
    script's defaults); ``f32_cache``: a float32 KV cache; ``spec_ngram``: its n-gram speculation
    with that many drafts."""
    command = [
        str(LLAMACPP_PYTHON),
        str(SERVER_SCRIPT),
        str(packaged_path(MODEL)),
        "--port",
        str(port),
        "--threads",
        str(threads),
    ]
    if slots is not None:
        command += ["--parallel", str(slots), "--ctx", str(slots * ctx_per_slot)]
    if spec_ngram:
        command += ["--spec-ngram", str(spec_ngram)]
    return command + (["--f32-cache"] if f32_cache else [])
