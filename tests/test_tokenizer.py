"""Tokenizers: bytes for presets (exact round trip), tokenizer.json for HF directories."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from actors.model.config import BYTE_EOS_ID, PRESETS
from actors.model.tokenizer import ByteTokenizer, HFTokenizer, load_tokenizer
from actors.server_args import ServerArgs


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


def write_word_level(path: Path) -> Path:
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"[UNK]": 0, "hello": 1, "world": 2, "</s>": 3}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens(["</s>"])
    path.mkdir(parents=True, exist_ok=True)
    tok.save(str(path / "tokenizer.json"))
    return path


@pytest.mark.parametrize(
    ("side_file", "body", "eos"),
    [
        ("config.json", {"eos_token_id": 3}, 3),
        ("config.json", {"eos_token_id": [3, 1]}, 3),
        ("tokenizer_config.json", {"eos_token": "</s>"}, 3),
        (None, None, None),
    ],
)
def test_tokenizer_json_round_trip(tmp_path: Path, side_file, body, eos) -> None:
    model_dir = write_word_level(tmp_path / "m")
    if side_file:
        (model_dir / side_file).write_text(json.dumps(body))
    tok = load_tokenizer(str(model_dir))  # a tokenizer-only directory (no model config.json)
    assert isinstance(tok, HFTokenizer)
    assert tok.encode("hello world hello") == [1, 2, 1]
    assert tok.decode([1, 2, 3]) == "hello world"
    assert tok.eos_token_id == eos


@pytest.mark.parametrize("model", sorted(PRESETS))
def test_presets_get_the_byte_tokenizer(model: str) -> None:
    assert isinstance(load_tokenizer(model), ByteTokenizer)
    assert isinstance(load_tokenizer(ServerArgs(model=model)), ByteTokenizer)


@pytest.mark.parametrize(
    ("setup", "message"),
    [
        (lambda d: None, "neither a preset"),
        (lambda d: d.mkdir(), "tokenizer.json: missing"),
        (lambda d: (d.mkdir(), (d / "tokenizer.json").write_text("{")), "unreadable tokenizer"),
    ],
    ids=["no-dir", "no-file", "garbage"],
)
def test_bad_tokenizer_dirs_name_the_file(tmp_path: Path, setup, message: str) -> None:
    model_dir = tmp_path / "m"
    setup(model_dir)
    with pytest.raises(ValueError, match=message):
        load_tokenizer(str(model_dir))
