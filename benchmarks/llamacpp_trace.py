"""llama.cpp's own logits for token ids, through its C API in the library xllamacpp ships, and
ours beside them: how ``--gguf-weights int8-dot`` was checked to be llama.cpp's model, to the
bit (and where to look first if a llama.cpp upgrade ever parts them).

    .venv/bin/python benchmarks/llamacpp_trace.py [--prompt TEXT] [--tokens 8] [--dump REGEX]

Runs llama.cpp (float32 KV cache, no flash attention, one thread: what
tests/integration/test_int8_dot_vs_llamacpp.py runs its server with) on the prompt, then on
``--tokens`` greedy tokens fed one ``llama_decode`` at a time, in a child process of the
``.venv-llamacpp`` interpreter (``make llamacpp``). Its evaluation callback sees every node of
llama.cpp's graph after it is computed; ``--dump`` names the ones to keep (e.g.
``'(attn_norm|kqv_out|ffn_out|l_out)-0'``) and the graph's first nodes are printed (the
operations and shapes the float arithmetic in ``kernels/quant/ggml_arith.cpp`` follows).
Then our int8-dot runner computes the same steps and each step's logits are compared.

The C structs are read from their known defaults: ``llama_context_default_params`` is checked
field by field before any offset is written, so a library whose layout moved is refused with
that message instead of being misread.
"""

from __future__ import annotations

import argparse
import json
import pickle
import subprocess
import sys
import tempfile
from pathlib import Path

from roundgate.bench.llamacpp import LLAMACPP_PYTHON, LLAMACPP_VENV, MODEL

# llama_context_params of this xllamacpp (byte offsets), with the defaults that identify them.
N_CTX, N_BATCH, N_UBATCH, N_THREADS, N_THREADS_BATCH = 0, 4, 8, 28, 32
FLASH_ATTN, CB_EVAL, TYPE_K, TYPE_V = 52, 88, 104, 108
EXPECTED = {N_CTX: 512, N_BATCH: 2048, N_UBATCH: 512, N_THREADS: 4, FLASH_ATTN: -1, TYPE_K: 1}

CHILD = r"""
import ctypes, json, pickle, re, struct, sys

lib = ctypes.CDLL(sys.argv[1])
model_path, steps, dump_re = sys.argv[2], json.loads(sys.argv[3]), sys.argv[4]
out_path = sys.argv[5]
vocab = int(sys.argv[6])
expected = {int(k): v for k, v in json.loads(sys.argv[7]).items()}
offsets = json.loads(sys.argv[8])

class Params(ctypes.Structure):
    _fields_ = [("raw", ctypes.c_uint8 * 512)]

class Batch(ctypes.Structure):
    pointers = ("token", "embd", "pos", "n_seq_id", "seq_id", "logits")
    _fields_ = [("n_tokens", ctypes.c_int32)] + [(n, ctypes.c_void_p) for n in pointers]

p, i32 = ctypes.c_void_p, ctypes.c_int32
lib.llama_context_default_params.restype = Params
lib.llama_model_default_params.restype = Params
lib.llama_model_load_from_file.argtypes = [ctypes.c_char_p, Params]
lib.llama_model_load_from_file.restype = p
lib.llama_init_from_model.argtypes = [p, Params]
lib.llama_init_from_model.restype = p
lib.llama_batch_get_one.argtypes = [p, i32]
lib.llama_batch_get_one.restype = Batch
lib.llama_decode.argtypes = [p, Batch]
lib.llama_decode.restype = i32
lib.llama_get_logits_ith.argtypes = [p, i32]
lib.llama_get_logits_ith.restype = ctypes.POINTER(ctypes.c_float)
for name in ("ggml_get_name", "ggml_op_desc"):
    getattr(lib, name).argtypes = [p]
    getattr(lib, name).restype = ctypes.c_char_p
lib.ggml_backend_tensor_get.argtypes = [p, p, ctypes.c_size_t, ctypes.c_size_t]
lib.ggml_nbytes.argtypes = [p]
lib.ggml_nbytes.restype = ctypes.c_size_t
Log = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p)
quiet = Log(lambda *a: None)
lib.llama_log_set(quiet, None)
lib.ggml_log_set(quiet, None)
lib.llama_backend_init()

params = lib.llama_context_default_params()
raw = bytearray(params.raw)
for offset, value in expected.items():
    found = struct.unpack_from("<i", raw, offset)[0]
    if found != value:
        sys.exit(f"llama_context_params moved: {found} at byte {offset}, expected {value}")
pattern = re.compile(dump_re) if dump_re else None
step, dumped, graph = 0, {}, []

@ctypes.CFUNCTYPE(ctypes.c_bool, p, ctypes.c_bool, p)
def on_node(tensor, ask, user):
    if ask:
        return True
    name = lib.ggml_get_name(tensor).decode()
    ne = struct.unpack_from("<4q", ctypes.string_at(tensor, 48), 16)
    if step == 0:
        graph.append(f"{name:24} {lib.ggml_op_desc(tensor).decode():10} {ne}")
    if pattern is not None and pattern.fullmatch(name):
        n = lib.ggml_nbytes(tensor)
        buf = ctypes.create_string_buffer(n)
        lib.ggml_backend_tensor_get(tensor, buf, 0, n)
        dumped[f"{step}:{len(graph)}:{name}"] = (ne, buf.raw)
    return True

struct.pack_into("<III", raw, offsets["n_ctx"], 512, 512, 512)
struct.pack_into("<ii", raw, offsets["threads"], 1, 1)
struct.pack_into("<i", raw, offsets["flash_attn"], 0)
struct.pack_into("<Q", raw, offsets["cb_eval"], ctypes.cast(on_node, ctypes.c_void_p).value)
struct.pack_into("<ii", raw, offsets["type_k"], 0, 0)
params.raw = (ctypes.c_uint8 * 512)(*raw)
model = lib.llama_model_load_from_file(model_path.encode(), lib.llama_model_default_params())
ctx = lib.llama_init_from_model(model, params)
if not model or not ctx:
    sys.exit("llama.cpp could not load the model")
logits = []
for step, ids in enumerate(steps):
    tokens = (ctypes.c_int32 * len(ids))(*ids)
    if lib.llama_decode(ctx, lib.llama_batch_get_one(tokens, len(ids))) != 0:
        sys.exit(f"llama_decode failed at step {step}")
    logits.append(ctypes.string_at(lib.llama_get_logits_ith(ctx, -1), 4 * vocab))
with open(out_path, "wb") as f:
    pickle.dump({"logits": logits, "graph": graph, "dumped": dumped}, f)
"""


def llamacpp_steps(steps: list[list[int]], vocab: int, dump: str) -> dict:
    """Run llama.cpp on ``steps`` (one ``llama_decode`` each) in its own venv's interpreter."""
    from roundgate.actors.model.gguf_file import packaged_path
    from roundgate.bench import ggml_ops

    library = ggml_ops.library_path(LLAMACPP_VENV)
    if library is None or not LLAMACPP_PYTHON.exists():
        raise SystemExit("no xllamacpp library: run `make llamacpp`")
    offsets = {
        "n_ctx": N_CTX,
        "threads": N_THREADS,
        "flash_attn": FLASH_ATTN,
        "cb_eval": CB_EVAL,
        "type_k": TYPE_K,
    }
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder, "trace.pkl")
        command = [
            str(LLAMACPP_PYTHON),
            "-c",
            CHILD,
            str(library),
            str(packaged_path(MODEL)),
            json.dumps(steps),
            dump,
            str(out),
            str(vocab),
            json.dumps(EXPECTED),
            json.dumps(offsets),
        ]
        done = subprocess.run(command, capture_output=True, text=True, timeout=600)
        if done.returncode != 0:
            raise SystemExit(f"llama.cpp run failed: {done.stderr.strip()[-800:]}")
        return pickle.loads(out.read_bytes())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--prompt", default="The capital of France is Paris. The capital of")
    parser.add_argument("--tokens", type=int, default=8, help="greedy tokens after the prompt")
    parser.add_argument("--dump", default="", help="regex of graph node names to keep")
    args = parser.parse_args()

    import numpy as np
    import torch

    from roundgate.actors.model.runner import ModelRunner
    from roundgate.actors.model.tokenizer import load_tokenizer
    from roundgate.actors.server_args import ServerArgs
    from roundgate.kernels.attention.batch import build_attention_batch

    torch.set_num_threads(1)
    runner = ModelRunner(
        ServerArgs(model=MODEL, device="cpu", num_kv_pages=64, gguf_weights="int8-dot")
    )
    ids = load_tokenizer(MODEL).encode(args.prompt)
    # Ours first (greedy), then llama.cpp on the same steps: the prompt, then one token each.
    steps, ours, cached = [ids], [], 0
    pages = list(range(-(-(len(ids) + args.tokens) // runner.args.page_size)))
    with torch.inference_mode():
        for k in range(args.tokens + 1):
            chunk = steps[k]
            batch = build_attention_batch(
                [len(chunk)], [cached], [pages], runner.args.page_size, runner.device
            )
            logits = runner.forward_batch(torch.tensor(chunk), batch).float()[0].numpy()
            ours.append(logits)
            cached += len(chunk)
            if k < args.tokens:
                steps.append([int(logits.argmax())])
    theirs = llamacpp_steps(steps, runner.config.vocab_size, args.dump)
    print(f"llama.cpp's graph, first nodes of {len(theirs['graph'])}:")
    print("\n".join(theirs["graph"][:44]))
    print(f"\nweights {runner.weight_path}, attention {runner.attention.name}")
    for k, (mine, raw) in enumerate(zip(ours, theirs["logits"], strict=True)):
        ref = np.frombuffer(raw, np.float32)
        kind = "prompt" if k == 0 else f"token {k}"
        print(
            f"step {k} ({kind}): logits equal {np.array_equal(mine, ref)}, "
            f"max |diff| {np.abs(mine - ref).max():.2e}, argmax {mine.argmax()} / {ref.argmax()}"
        )
    for key, (ne, raw) in theirs["dumped"].items():
        print(f"dumped {key} {ne}: {len(raw)} bytes")


if __name__ == "__main__":
    sys.exit(main())
