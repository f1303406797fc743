"""A GGUF file's header, read fast: its metadata and where each tensor lies.

Every process that serves a GGUF model reads the header (``ServerArgs`` sizes the pool from
the model's shape, the ingress checks requests against it, each rank loads the tensors), and
the ``gguf`` package's reader builds a numpy view for every element of every metadata array
on the way: for SmolLM2's 49k-token vocabulary and 48k merges that is about a million views,
2-6 s a process, before any tensor is read. This reader walks the same bytes with ``struct``,
skips the arrays (keeping where they are, decoded only when asked for) and records where each
tensor lies (``gguf_source`` maps them as the ``gguf`` package's reader would). Standard
library only: ``ServerArgs`` reads the header in the control plane, which loads no numpy.

The format (GGUF v2/v3, little-endian): magic, version, tensor count, metadata count; the
metadata as (key, type, value); then each tensor's name, dimensions, type and offset; the
tensor data from the next multiple of ``general.alignment`` (32 by default).
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MAGIC = b"GGUF"
VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32

# Metadata value types: struct format of the scalars; 8 is a string, 9 an array.
_SCALARS = {
    0: "<B",
    1: "<b",
    2: "<H",
    3: "<h",
    4: "<I",
    5: "<i",
    6: "<f",
    7: "<?",
    10: "<Q",
    11: "<q",
    12: "<d",
}
STRING, ARRAY = 8, 9


@dataclass(frozen=True)
class ArrayField:
    """A metadata array left undecoded: its element type, length and first element's offset."""

    element_type: int
    count: int
    offset: int


@dataclass(frozen=True)
class TensorInfo:
    """One tensor's record: ``shape`` as the file stores it (fastest dimension first), its
    ggml type number, and the byte offset of its data in the file."""

    name: str
    shape: tuple[int, ...]
    ggml_type: int
    offset: int


class _Cursor:
    def __init__(self, buffer: Any, path: Path) -> None:
        self.buffer = buffer
        self.at = 0
        self.path = path

    def unpack(self, fmt: str) -> Any:
        try:
            (value,) = struct.unpack_from(fmt, self.buffer, self.at)
        except struct.error:
            raise ValueError(f"{self.path}: not a readable GGUF file (truncated header)") from None
        self.at += struct.calcsize(fmt)
        return value

    def string(self) -> str:
        size = self.unpack("<Q")
        end = self.at + size
        if end > len(self.buffer):
            raise ValueError(f"{self.path}: not a readable GGUF file (string past the end)")
        raw = bytes(self.buffer[self.at : end])
        self.at = end
        return raw.decode("utf-8", errors="replace")

    def skip_value(self, kind: int) -> None:
        if kind == STRING:
            size = self.unpack("<Q")  # read first: it moves the cursor past the length
            self.at += size
        elif kind in _SCALARS:
            self.at += struct.calcsize(_SCALARS[kind])
        else:
            raise ValueError(f"{self.path}: not a readable GGUF file (value type {kind})")

    def value(self, kind: int) -> Any:
        if kind == STRING:
            return self.string()
        if kind == ARRAY:
            element, count = self.unpack("<I"), self.unpack("<Q")
            field = ArrayField(element, count, self.at)
            if element in _SCALARS:
                self.at += count * struct.calcsize(_SCALARS[element])
            else:
                for _ in range(count):
                    self.skip_value(element)
            return field
        if kind not in _SCALARS:
            raise ValueError(f"{self.path}: not a readable GGUF file (value type {kind})")
        return self.unpack(_SCALARS[kind])


class GGUFHeader:
    """The parsed header of one GGUF file, over a read-only memory map of it."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            with open(path, "rb") as file:
                self._map = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ)
        except (OSError, ValueError) as exc:
            raise ValueError(f"{path}: not a readable GGUF file ({exc})") from exc
        cursor = _Cursor(self._map, path)
        if bytes(self._map[:4]) != MAGIC:
            raise ValueError(f"{path}: not a GGUF file (no GGUF magic)")
        cursor.at = 4
        self.version = cursor.unpack("<I")
        if self.version not in VERSIONS:
            raise ValueError(f"{path}: GGUF version {self.version} is not supported")
        tensor_count, field_count = cursor.unpack("<Q"), cursor.unpack("<Q")
        self.fields: dict[str, Any] = {}
        for _ in range(field_count):
            key = cursor.string()
            self.fields[key] = cursor.value(cursor.unpack("<I"))
        self.tensors: list[TensorInfo] = []
        for _ in range(tensor_count):
            name = cursor.string()
            dims = tuple(cursor.unpack("<Q") for _ in range(cursor.unpack("<I")))
            self.tensors.append(TensorInfo(name, dims, cursor.unpack("<I"), cursor.unpack("<Q")))
        alignment = self.fields.get("general.alignment", DEFAULT_ALIGNMENT)
        if not isinstance(alignment, int) or alignment <= 0:
            raise ValueError(f"{path}: GGUF general.alignment {alignment!r} is not valid")
        self.data_offset = -(-cursor.at // alignment) * alignment

    def get(self, key: str, default: Any = None) -> Any:
        """A metadata value (an array decoded to a list), or ``default``."""
        value = self.fields.get(key, default)
        return self.array(value) if isinstance(value, ArrayField) else value

    def array_length(self, key: str) -> int | None:
        value = self.fields.get(key)
        return value.count if isinstance(value, ArrayField) else None

    @property
    def buffer(self) -> mmap.mmap:
        """The file, memory-mapped read-only (the tensors' bytes lie at ``data_offset``)."""
        return self._map

    def array(self, field: ArrayField) -> list[Any]:
        cursor = _Cursor(self._map, self.path)
        cursor.at = field.offset
        return [cursor.value(field.element_type) for _ in range(field.count)]
