"""How long each prompt waited for the prefill policy, in rounds (the admission-wait metric).

The wait starts at the round the rank first *published* a want for the prompt (the gate could
have seen it) and ends at its first prefill chunk. Rounds in which the prompt was held for
reasons the gate does not own (KV pressure, a full batch) are excused: they are counted while
the prompt waits and subtracted from its wait.
"""

from __future__ import annotations

from roundgate.actors.control.request import Request


class AdmissionWaits:
    """Stamps prompts at their first published want and first prefill; one per scheduler."""

    def __init__(self) -> None:
        self.excused_rounds = 0
        # Prompts not yet covered by a published want, and the excused count at their want.
        self._unstamped: list[Request] = []
        self._excused_at_want: dict[str, int] = {}

    def excuse(self, num_rounds: int = 1) -> None:
        """``num_rounds`` rounds held a waiting prompt for pressure or a full batch."""
        self.excused_rounds += num_rounds

    @property
    def has_unstamped(self) -> bool:
        """Whether some prompt waits for its first published want (``wanted`` has work)."""
        return bool(self._unstamped)

    def arrived(self, req: Request) -> None:
        self._unstamped.append(req)

    def wanted(self, round_index: int) -> None:
        """The rank published a want this round: every unstamped prompt starts waiting."""
        if not self._unstamped:
            return
        for req in self._unstamped:
            if req.first_want_round is None and req.first_prefill_round is None:
                req.first_want_round = round_index
                self._excused_at_want[req.request_id] = self.excused_rounds
        self._unstamped.clear()

    def first_prefill(self, req: Request, round_index: int) -> None:
        req.first_prefill_round = round_index
        at_want = self._excused_at_want.pop(req.request_id, None)
        if at_want is not None:
            req.excused_wait_rounds = self.excused_rounds - at_want

    def forget(self, req: Request) -> None:
        """An aborted prompt stops being tracked."""
        self._excused_at_want.pop(req.request_id, None)
        if req in self._unstamped:
            self._unstamped.remove(req)

    @staticmethod
    def of(req: Request) -> int | None:
        """Rounds from first published want to first prefill, less the excused ones."""
        if req.first_want_round is None or req.first_prefill_round is None:
            return None
        return req.first_prefill_round - req.first_want_round - req.excused_wait_rounds
