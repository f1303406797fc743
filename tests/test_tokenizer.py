"""Tokenizers: bytes for the random presets, the model's own (transformers) for real models,
chat templates, the stop-id union and generation_config defaults."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from roundgate.actors.model.config import BYTE_EOS_ID, PRESETS, ModelConfig
from roundgate.actors.model.generation_config import read_generation_config
from roundgate.actors.model.tokenizer import (
    ByteTokenizer,
    ChatTemplateError,
    HFTokenizer,
    load_tokenizer,
    stop_token_ids,
)

TEMPLATE = (
    "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}</s>{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)


@pytest.mark.parametrize("text", ["", "hello", "naïve café ☕", "line\nbreak\t\x00", "日本語"])
def test_byte_round_trip(text: str) -> None:
    tok = ByteTokenizer()
    ids = tok.encode(text)
    assert all(0 <= i < 256 for i in ids)
    assert tok.decode(ids) == text
    assert tok.decode([*tok.encode(text, add_bos=True), tok.eos_token_id]) == text


def test_byte_ids_fit_every_preset() -> None:
    assert all(ByteTokenizer.vocab_size <= c.vocab_size for c in PRESETS.values())
    assert all(c.eos_token_ids == (BYTE_EOS_ID,) for c in PRESETS.values())


def test_broken_utf8_decodes_with_replacement() -> None:
    assert ByteTokenizer().decode([0xE6, 0x97]) == "\ufffd"


def test_presets_keep_an_explicit_transcript_template() -> None:
    tok = load_tokenizer("tiny-moe")
    assert isinstance(tok, ByteTokenizer)
    ids = tok.render_chat([{"role": "system", "content": "s"}, {"role": "user", "content": "hi"}])
    assert tok.decode(ids) == "<|system|>\ns\n<|user|>\nhi\n<|assistant|>\n"
    with pytest.raises(ChatTemplateError, match="no tools"):
        tok.render_chat([{"role": "user", "content": "hi"}], tools=[{"type": "function"}])


def write_word_level(path: Path, template: str | None = None) -> Path:
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"[UNK]": 0, "hello": 1, "world": 2, "</s>": 3, "<user>": 4, "<assistant>": 5}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens(["</s>", "<user>", "<assistant>"])
    path.mkdir(parents=True, exist_ok=True)
    tok.save(str(path / "tokenizer.json"))
    config = {"eos_token": "</s>", "unk_token": "[UNK]"}
    if template is not None:
        config["chat_template"] = template
    (path / "tokenizer_config.json").write_text(json.dumps(config))
    return path


def test_the_model_s_own_tokenizer_and_template(tmp_path: Path) -> None:
    tok = load_tokenizer(str(write_word_level(tmp_path / "m", TEMPLATE)))
    assert isinstance(tok, HFTokenizer)
    assert tok.encode("hello world hello") == [1, 2, 1]
    assert tok.decode([1, 2, 3]) == "hello world"  # specials are not text
    assert tok.eos_token_id == 3
    ids = tok.render_chat([{"role": "user", "content": "hello"}])
    assert ids == [4, 1, 3, 5]


def test_a_saved_tokenizer_loads_back_the_same(tmp_path: Path) -> None:
    # What an external client (AIPerf in benchmarks/aiperf_compare.py) is given to load.
    tok = load_tokenizer(str(write_word_level(tmp_path / "m", TEMPLATE)))
    tok.save_pretrained(str(tmp_path / "saved"))
    again = load_tokenizer(str(tmp_path / "saved"))
    assert again.encode("hello world hello") == [1, 2, 1]
    assert again.render_chat([{"role": "user", "content": "hello"}]) == [4, 1, 3, 5]


def test_chat_template_file_overrides_and_a_model_without_one_is_refused(tmp_path: Path) -> None:
    model = str(write_word_level(tmp_path / "m"))
    with pytest.raises(ChatTemplateError, match=r"no chat template.*--chat-template"):
        load_tokenizer(model).render_chat([{"role": "user", "content": "hello"}])
    override = tmp_path / "t.jinja"
    override.write_text("{% for m in messages %}{{ m['content'] }} {% endfor %}world")
    assert load_tokenizer(model, str(override)).render_chat([{"role": "user", "content": "hello"}])
    with pytest.raises(ValueError, match=r"--chat-template .*cannot read"):
        load_tokenizer(model, str(tmp_path / "missing.jinja"))


def test_a_template_that_refuses_is_a_chat_template_error(tmp_path: Path) -> None:
    strict = "{{ raise_exception('system messages are not supported') }}"
    tok = load_tokenizer(str(write_word_level(tmp_path / "m", strict)))
    with pytest.raises(ChatTemplateError, match="system messages are not supported"):
        tok.render_chat([{"role": "system", "content": "x"}])


def test_stop_ids_are_the_union_of_config_generation_config_and_tokenizer(
    tmp_path: Path,
) -> None:
    model = write_word_level(tmp_path / "m", TEMPLATE)
    (model / "generation_config.json").write_text(
        json.dumps({"eos_token_id": [2, 5], "temperature": 0.6, "top_p": 0.9, "do_sample": True})
    )
    config = ModelConfig(
        vocab_size=6,
        hidden_size=8,
        num_layers=1,
        num_heads=2,
        num_kv_heads=1,
        head_dim=4,
        intermediate_size=8,
        eos_token_ids=(1,),
    )
    tok = load_tokenizer(str(model))
    assert stop_token_ids(config, tok, read_generation_config(str(model))) == (1, 2, 5, 3)
    defaults = read_generation_config(str(model))
    assert (defaults.temperature, defaults.top_p, defaults.top_k) == (0.6, 0.9, None)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("{", "not valid JSON"),
        (json.dumps({"eos_token_id": "x"}), "eos_token_id must be an int"),
        (json.dumps({"temperature": "hot"}), "temperature must be a number"),
    ],
)
def test_bad_generation_config_names_the_file(tmp_path: Path, body: str, message: str) -> None:
    (tmp_path / "generation_config.json").write_text(body)
    with pytest.raises(ValueError, match=f"generation_config.json: {message}"):
        read_generation_config(str(tmp_path))


def test_a_greedy_generation_config_sets_no_sampling_defaults(tmp_path: Path) -> None:
    (tmp_path / "generation_config.json").write_text(
        json.dumps({"do_sample": False, "temperature": 0.6})
    )
    assert read_generation_config(str(tmp_path)).temperature is None


@pytest.mark.parametrize(
    ("setup", "message"),
    [
        (lambda d: None, "no such directory"),
        (lambda d: d.mkdir(), "cannot load its tokenizer"),
        (
            lambda d: (d.mkdir(), (d / "tokenizer.json").write_text("{")),
            "cannot load its tokenizer",
        ),
    ],
    ids=["no-dir", "no-file", "garbage"],
)
def test_bad_tokenizer_dirs_name_the_directory(tmp_path: Path, setup, message: str) -> None:
    model_dir = tmp_path / "m"
    setup(model_dir)
    with pytest.raises(ValueError, match=message):
        load_tokenizer(str(model_dir))
