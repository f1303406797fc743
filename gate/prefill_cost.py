"""What a prefill costs the group, learned from the gathered rows' shared clock.

A round's length is the difference between the ``now_ms`` columns (each the max over ranks of
the rank's clock, so every rank reads the same value) of two consecutive rounds. A round with
no extend gives the decode round's length; a round with an extend is the decode round plus a
*step*: a fixed cost of running an extend at all (kernel launches, the slow collective path)
plus a cost per prompt token of the longest extend of any rank (the group waits for its
slowest rank). The step is fitted online as ``fixed + per_token * tokens`` by exponentially
weighted least squares, so it follows the model and the hardware without a preset, and a
prompt's own prefill time is ``fixed + per_token * its tokens``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from roundgate.gate.rows import RankRow

# Weight of a round's sample in the running averages: recent enough to follow a change of
# batch shape, smooth enough that one slow round (a GC pause) does not swing the estimate.
_EWMA = 0.1


def prefill_tokens(rows: Sequence[RankRow]) -> int:
    """The most prompt tokens any rank extends in this round: the round waits for that rank.
    A decode contributes one token to ``num_tokens``, an extend its chunk."""
    return max((row.num_tokens - (row.batch_size - row.num_extends) for row in rows), default=0)


@dataclass
class PrefillCost:
    """Running estimates of the decode round and of the extend step (fixed + per token)."""

    decode_ms: float | None = None
    # Weighted means of x = tokens, y = step, x*x and x*y over extend rounds (least squares).
    _n: float = 0.0
    _x: float = 0.0
    _y: float = 0.0
    _xx: float = 0.0
    _xy: float = 0.0

    def add_round(self, duration_ms: float, tokens: int) -> None:
        """One finished round: ``tokens`` the longest extend in it (0: a decode round)."""
        if duration_ms <= 0:
            return
        if tokens <= 0:
            self.decode_ms = _mix(self.decode_ms, duration_ms)
            return
        if self.decode_ms is None:
            return  # the step needs the decode round it adds to
        step = max(0.0, duration_ms - self.decode_ms)
        w = _EWMA if self._n else 1.0
        self._n = 1.0
        self._x += w * (tokens - self._x)
        self._y += w * (step - self._y)
        self._xx += w * (tokens * tokens - self._xx)
        self._xy += w * (tokens * step - self._xy)

    @property
    def known(self) -> bool:
        return self._n > 0

    def step_ms(self, tokens: float) -> float:
        """The extra time a round costs when its longest extend is ``tokens`` long."""
        if not self._n:
            return 0.0
        var = self._xx - self._x * self._x
        if var <= 1e-9 * max(1.0, self._xx):
            # Every extend so far had the same length: all of the step is per token.
            per_token = self._y / self._x if self._x else 0.0
            return per_token * tokens
        per_token = max(0.0, (self._xy - self._x * self._y) / var)
        fixed = max(0.0, self._y - per_token * self._x)
        return fixed + per_token * tokens


def _mix(old: float | None, sample: float) -> float:
    return sample if old is None else old + _EWMA * (sample - old)
