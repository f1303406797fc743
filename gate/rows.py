"""One rank's row of the per-round batch-metadata all-gather."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

# The int64 column layout of the gather, in order. This tuple is the single definition: pack,
# unpack and every consumer (metrics, the torch gather) index through it.
COLUMNS: tuple[str, ...] = (
    "num_tokens",
    "batch_size",
    "num_extends",
    "wants_prefill",
    "has_decode_work",
)
NUM_COLUMNS = len(COLUMNS)


@dataclass(frozen=True, slots=True)
class RankRow:
    """What one rank publishes each round: its planned batch and its two probe booleans.

    The probe booleans ride the batch-metadata gather as two extra integer columns, so the
    gate needs no collective of its own.
    """

    num_tokens: int
    batch_size: int
    num_extends: int
    wants_prefill: bool
    has_decode_work: bool

    @property
    def is_idle(self) -> bool:
        """Nothing planned on this rank this round."""
        return self.batch_size == 0 and self.num_tokens == 0

    def pack(self) -> tuple[int, ...]:
        """The row as int64 values in ``COLUMNS`` order."""
        return (
            self.num_tokens,
            self.batch_size,
            self.num_extends,
            int(self.wants_prefill),
            int(self.has_decode_work),
        )

    @classmethod
    def unpack(cls, ints: Sequence[int]) -> RankRow:
        """Inverse of ``pack``; extra trailing columns (other policies' data) are ignored."""
        if len(ints) < NUM_COLUMNS:
            raise ValueError(f"a RankRow needs {NUM_COLUMNS} columns {COLUMNS}, got {len(ints)}")
        num_tokens, batch_size, num_extends, wants, decodes = (int(v) for v in ints[:NUM_COLUMNS])
        return cls(num_tokens, batch_size, num_extends, bool(wants), bool(decodes))


IDLE_ROW = RankRow(0, 0, 0, False, False)
