"""The default model, offline: SmolLM2-135M-Instruct from its packaged GGUF file.

Our loader (GGUF metadata -> config, dequantized tensors, Q/K un-permuted) must give
transformers' greedy tokens exactly, and its tokenizer and chat template must make the model
answer as it was trained to.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from roundgate.actors.engine import Engine, SamplingParams
from roundgate.actors.model import gguf_file
from roundgate.actors.model.generation_config import read_generation_config
from roundgate.actors.model.tokenizer import HFTokenizer, load_tokenizer, stop_token_ids
from roundgate.actors.server_args import ServerArgs

MODEL = "smollm2-135m-instruct"
PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time, a robot"]


@pytest.fixture(scope="module")
def path() -> Path:
    return gguf_file.packaged_path(MODEL)


@pytest.fixture(scope="module")
def tokenizer() -> HFTokenizer:
    tok = load_tokenizer(MODEL)
    assert isinstance(tok, HFTokenizer)
    return tok


@pytest.fixture(scope="module")
def engine() -> Engine:
    torch.set_num_threads(1)
    return Engine(ServerArgs(model=MODEL, device="cpu", num_kv_pages=128, max_num_seqs=8))


def test_the_config_comes_from_the_gguf_metadata(path: Path) -> None:
    config = gguf_file.read_config(path)
    assert (config.num_layers, config.hidden_size, config.num_heads, config.num_kv_heads) == (
        30,
        576,
        9,
        3,
    )
    assert config.vocab_size == 49152 and config.max_position == 8192
    assert config.tie_word_embeddings and config.rope_theta == 100000.0
    assert ServerArgs(model=MODEL).max_model_len == 8192


def test_greedy_tokens_equal_transformers_on_the_same_gguf(
    path: Path, tokenizer: HFTokenizer, engine: Engine
) -> None:
    from transformers import AutoModelForCausalLM

    reference = AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32
    ).eval()
    prompts = [tokenizer.encode(p) for p in PROMPTS]
    ours = engine.generate(prompts, SamplingParams(max_tokens=24))
    for ids, got in zip(prompts, ours, strict=True):
        with torch.inference_mode():
            out = reference.generate(
                torch.tensor([ids]), max_new_tokens=24, do_sample=False, eos_token_id=None
            )
        want = out[0, len(ids) :].tolist()
        # transformers may stop early on its EOS; ours ran the full 24 (no stop ids given).
        assert got[: len(want)] == want


def test_chat_uses_the_model_s_template_and_stops_at_end_of_turn(
    tokenizer: HFTokenizer, engine: Engine
) -> None:
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    ids = tokenizer.render_chat(messages)
    expected = tokenizer._tok.apply_chat_template(messages, add_generation_prompt=True)
    assert ids == list(expected["input_ids"])
    stops = stop_token_ids(engine.args.model_config, tokenizer, read_generation_config(MODEL))
    assert tokenizer._tok.convert_tokens_to_ids("<|im_end|>") in stops
    (out,) = engine.generate([ids], SamplingParams(max_tokens=48, stop_token_ids=stops))
    assert out[-1] in stops, "the answer must end at the end-of-turn token"
    assert "Paris" in tokenizer.decode(out)


def test_a_multi_turn_conversation_renders_every_turn(tokenizer: HFTokenizer) -> None:
    messages = [
        {"role": "system", "content": "Answer in one word."},
        {"role": "user", "content": "Capital of Italy?"},
        {"role": "assistant", "content": "Rome."},
        {"role": "user", "content": "And of Spain?"},
    ]
    ids = tokenizer.render_chat(messages)
    expected = tokenizer._tok.apply_chat_template(messages, add_generation_prompt=True)
    assert ids == list(expected["input_ids"])
    text = tokenizer._tok.decode(ids)
    assert "Answer in one word." in text and "Rome." in text
    assert text.endswith("<|im_start|>assistant\n")


def test_an_unsupported_gguf_architecture_is_named(tmp_path: Path) -> None:
    import gguf

    out = tmp_path / "m.gguf"
    writer = gguf.GGUFWriter(str(out), "mamba")
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ValueError, match="GGUF architecture 'mamba' is not supported"):
        ServerArgs(model=str(out))


def test_the_gguf_tokenizer_conversion_is_cached_by_the_file_s_hash(
    path: Path, tokenizer: HFTokenizer
) -> None:
    from roundgate.actors.model.tokenizer import cache_dir, file_digest

    cached = cache_dir() / "tokenizers" / file_digest(path)
    assert (cached / "tokenizer_config.json").is_file()
    again = load_tokenizer(str(path))  # the file itself, this time: the same cached tokenizer
    assert again.encode("Hello world") == tokenizer.encode("Hello world")
