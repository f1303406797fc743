"""An elastic MoE rank's forward: a member lost mid-round re-forms the group, not ends it.

A dense elastic group's only collective is the round's gather, which re-forms the group when
it fails (``ElasticGather``). A MoE group has more: every MoE layer's dispatch and combine,
and EPLB's rebalance. A member that dies after the gather fails those in the survivors'
forward. ``ElasticForward`` wraps the runner: such a failure re-forms the group exactly as a
failed gather does (the members left agree on the next epoch; each re-homes the experts,
``RankEngine.regroup``), and raises ``RoundAborted``, on which the rank's loop gathers the
round's row again in the new group and runs the forward again. The dead member's requests
resume elsewhere through the ingress, as in a dense group.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from roundgate.actors.control.executor import RoundAborted
from roundgate.actors.control.request import Request
from roundgate.actors.control.round import RoundPlan, RoundResult
from roundgate.gate.rows import RankRow, RoundView

if TYPE_CHECKING:
    from roundgate.actors.model.runner import ModelRunner

logger = logging.getLogger("roundgate.rank")


# What gloo and NCCL say when a peer of a collective is gone or a collective timed out (gloo
# raises a plain RuntimeError, "Connection closed by peer", "Connection reset by peer", "Timed
# out waiting ... for recv operation", so the type alone cannot tell).
_PEER_LOST = ("connection", "timed out", "timeout", "gloo", "nccl", "peer", "broken pipe")


def lost_peer(exc: RuntimeError) -> bool:
    """Whether a forward's ``exc`` is a collective that lost a member (re-form), not the
    rank's own failure (out of memory, a CUDA error, a bug: those end the rank, as before,
    instead of making every member re-form and fail the same way again)."""
    import torch

    if isinstance(exc, torch.OutOfMemoryError):
        return False
    if isinstance(exc, torch.distributed.DistError):
        return True
    text = str(exc).lower()
    return any(word in text for word in _PEER_LOST)


class ElasticForward:
    """``Executor``: the runner's ``execute``, re-forming the group when a collective fails."""

    def __init__(self, runner: ModelRunner, reform: Callable[[], None]) -> None:
        self.runner = runner
        self.reform = reform  # the membership's: next epoch, new group, re-homed experts

    def execute(self, plan: RoundPlan, rows: Sequence[RankRow], view: RoundView) -> RoundResult:
        try:
            return self.runner.execute(plan, rows, view)
        except RuntimeError as exc:
            if not lost_peer(exc):
                raise
            logger.warning("a MoE collective failed mid-round (%s): re-forming the group", exc)
            self.reform()
            raise RoundAborted(f"the group re-formed mid-round: {exc}") from exc

    # What ``EngineCore`` asks of an executor besides ``execute``: the runner's own.
    def drop_parked(self, request_id: str) -> None:
        self.runner.drop_parked(request_id)

    def check_request(self, request: Request) -> None:
        self.runner.check_request(request)
