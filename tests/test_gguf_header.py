"""The fast GGUF header reader against the ``gguf`` package's reader, on the default model's
file: the same metadata, the same tensors laid out the same way; and a damaged file named."""

from __future__ import annotations

import struct
from pathlib import Path

import gguf
import numpy as np
import pytest

from roundgate.actors.model.gguf_file import packaged_path, read_config
from roundgate.actors.model.gguf_header import GGUFHeader
from roundgate.actors.model.gguf_source import map_tensor

MODEL = "smollm2-135m-instruct"


@pytest.fixture(scope="module")
def path() -> Path:
    return packaged_path(MODEL)


@pytest.fixture(scope="module")
def reference(path: Path) -> gguf.GGUFReader:
    return gguf.GGUFReader(str(path))


def test_every_metadata_field_equals_the_gguf_package(path: Path, reference) -> None:
    header = GGUFHeader(path)
    keys = [k for k in reference.fields if not k.startswith("GGUF.")]
    assert set(keys) == set(header.fields)
    for key in keys:
        expected = reference.fields[key].contents()
        got = header.get(key)
        if isinstance(expected, float):
            assert got == pytest.approx(expected), key
        else:
            assert got == expected, key
    assert header.array_length("tokenizer.ggml.tokens") == 49152


def test_every_tensor_is_the_same_view_as_the_gguf_package(path: Path, reference) -> None:
    header = GGUFHeader(path)
    assert [t.name for t in header.tensors] == [t.name for t in reference.tensors]
    for info, expected in zip(header.tensors, reference.tensors, strict=True):
        tensor = map_tensor(header, info)
        assert tensor.tensor_type == expected.tensor_type, info.name
        assert tensor.shape == tuple(int(d) for d in expected.shape), info.name
        assert tensor.data.dtype == expected.data.dtype, info.name
        assert tensor.data.shape == expected.data.shape, info.name
        assert np.array_equal(tensor.data, expected.data), info.name


def test_the_config_reads_the_model_shape(path: Path) -> None:
    config = read_config(path)
    assert (config.vocab_size, config.num_layers, config.num_heads) == (49152, 30, 9)
    assert config.tie_word_embeddings


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda raw: b"GGUX" + raw[4:], "no GGUF magic"),
        (lambda raw: raw[:4] + struct.pack("<I", 9) + raw[8:], "version 9"),
        (lambda raw: raw[:4096], "past the end|truncated"),
        (lambda raw: b"", "not a readable GGUF file|no GGUF magic"),
    ],
    ids=["magic", "version", "truncated", "empty"],
)
def test_a_damaged_file_is_named(path: Path, tmp_path: Path, damage, message: str) -> None:
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(damage(path.read_bytes()[: 1 << 20]))
    with pytest.raises(ValueError, match=message) as raised:
        GGUFHeader(bad)
    assert str(bad) in str(raised.value)
