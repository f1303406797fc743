"""One rank's row of the per-round batch-metadata all-gather."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import InitVar, dataclass

# The int64 column layout of the gather, in order. This tuple is the single definition: pack,
# unpack and every consumer (metrics, the torch gather) index through it. A policy may append
# extra int columns after these (``PrefillPolicy.extra_columns``); they travel in the same
# gathered row, so the gather stays one collective.
COLUMNS: tuple[str, ...] = (
    "num_tokens",
    "batch_size",
    "num_extends",
    "wants_prefill",
    "has_decode_work",
)
NUM_COLUMNS = len(COLUMNS)


@dataclass(frozen=True)
class RankRow:
    """What one rank publishes each round: its planned batch and its two probe booleans.

    The probe booleans ride the batch-metadata gather as two extra integer columns, so the
    gate needs no collective of its own. ``extras`` holds the selected policy's own columns
    (e.g. KV usage for SGLang's delayer), in the order the policy declares them; they are not
    part of the row's identity (equality and repr cover the five gate columns).
    """

    num_tokens: int
    batch_size: int
    num_extends: int
    wants_prefill: bool
    has_decode_work: bool
    extras: InitVar[tuple[int, ...]] = ()

    def __post_init__(self, extras: tuple[int, ...]) -> None:
        # An InitVar is not a field, so it must be stored by hand (frozen: via object).
        object.__setattr__(self, "extras", tuple(extras))

    def pack(self) -> tuple[int, ...]:
        """The row as int64 values: ``COLUMNS`` order, then the policy's extra columns."""
        return (
            self.num_tokens,
            self.batch_size,
            self.num_extends,
            int(self.wants_prefill),
            int(self.has_decode_work),
            *self.extras,
        )

    @classmethod
    def unpack(cls, ints: Sequence[int]) -> RankRow:
        """Inverse of ``pack``; columns after the gate's five become ``extras``."""
        if len(ints) < NUM_COLUMNS:
            raise ValueError(f"a RankRow needs {NUM_COLUMNS} columns {COLUMNS}, got {len(ints)}")
        num_tokens, batch_size, num_extends, wants, decodes = (int(v) for v in ints[:NUM_COLUMNS])
        extras = tuple(int(v) for v in ints[NUM_COLUMNS:])
        return cls(num_tokens, batch_size, num_extends, bool(wants), bool(decodes), extras)


@dataclass(frozen=True, slots=True)
class RoundView:
    """The one reading of a round's gathered rows that everything downstream shares.

    The gate, the peers, the executor (DeepEP mode), stats, metrics, the gate log and the
    simulator all ask the same two questions of the rows; ``read_rows`` answers them once.
    """

    any_extend: bool  # some rank extends a prompt: the group's slow (prefill) round
    all_idle: bool  # no rank has anything planned: nobody runs a forward

    @property
    def busy(self) -> bool:
        return not self.all_idle

    @property
    def low_latency(self) -> bool:
        """DeepEP low-latency legs (and the decode graph) are usable: nobody extends."""
        return not self.any_extend

    @property
    def decode_only(self) -> bool:
        """A busy round in which nobody extends: the fast round the gate exists to protect."""
        return not self.any_extend and not self.all_idle


# The four possible readings, shared: one is read per round on every rank.
_VIEWS = {(e, i): RoundView(e, i) for e in (False, True) for i in (False, True)}


def read_rows(rows: Sequence[RankRow]) -> RoundView:
    """Whether any rank extends and whether every rank is idle, in one pass."""
    idle = True
    for row in rows:
        if row.num_extends:
            return _VIEWS[True, False]
        if idle and (row.batch_size or row.num_tokens):
            idle = False
    return _VIEWS[False, idle]
