"""The two parts a rank replica composes, as interfaces: its membership and its role.

A rank (``roundgate.actors.replica.rank_replica``) is a Serve shell around one engine thread
(``rank_engine``). What differs between deployments is in two parts it owns:

- a **membership**: who the rank is in its DP group and how the group gathers its rows,
  sleeps when idle, wakes and re-forms. A gang (``gang_membership``) is fixed for its life; an
  elastic group (``elastic``) re-forms around a dead member and admits joiners.
- a **role**: what the rank does with requests. Fused (``fused_role``) prefills and decodes;
  prefill (``prefill_role``) hands each request off after its first token; decode
  (``decode_role``) takes handoffs and receives their KV.

The parts talk to each other only through these methods and the engine's public ones: the
membership never sees the role, and the role reaches the group only through ``wake``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol, TypeVar

from roundgate.actors.control.executor import Executor
from roundgate.actors.control.gather import Gather
from roundgate.actors.control.rank_loop import RoundOutcome
from roundgate.actors.replica.outbox import RoundOutbox
from roundgate.actors.role import DisaggregationRole
from roundgate.actors.server_args import ServerArgs

if TYPE_CHECKING:
    from roundgate.actors.model.runner import ModelRunner

# What a membership reports after it (re)formed its group: (this rank's row in the gathered
# rows, the group's size, why: "fault" or "join" after a re-form, None when first formed).
OnRegroup = Callable[[int, int, str | None], None]


Role = TypeVar("Role")


class RoleMismatch(ValueError):
    """A Serve method this rank's role does not serve (e.g. ``decode`` on a prefill rank)."""


def served_by(role: RankRole, kind: type[Role], method: str) -> Role:
    """``role`` if it is a ``kind`` (the role that serves ``method``), else ``RoleMismatch``
    naming both roles."""
    if isinstance(role, kind):
        return role
    mine = role.name
    raise RoleMismatch(
        f"{method}() is a {kind.name} rank's method; this rank's role is {mine} "
        f"(--disaggregation-mode {mine})"
    )


class RankMembership(Protocol):
    """A rank's place in its DP group: identity, gather, idle pause and wake, re-forms."""

    rank: int  # the stable dp_rank: a gang's rank, or an elastic seat's
    gang_id: str  # the group's id: metrics, logs, the routers' metadata

    @property
    def world_size(self) -> int:
        """The group's size now (an elastic group's as its last re-form left it)."""
        ...

    @property
    def row_rank(self) -> int:
        """This rank's row in the gathered rows (an elastic group's: its epoch rank)."""
        ...

    @property
    def epoch(self) -> int | None:
        """The membership epoch (elastic), None for a gang (it never re-forms)."""
        ...

    def build_runner(self, args: ServerArgs) -> ModelRunner:
        """The rank's model runner (called on the engine thread: it loads the model)."""
        ...

    def executor(self, runner: ModelRunner) -> Executor:
        """What runs the rank's rounds: ``runner``, or a wrapper of it that survives a
        member lost mid-round (an elastic MoE group)."""
        ...

    async def enter(self, outbox: RoundOutbox, on_regroup: OnRegroup) -> Gather:
        """Once the model is loaded: form (or be admitted to) the group; the gather the
        rounds run through, which sends ``outbox``'s held items after each collective.
        ``on_regroup`` hears each (re)formed group, on the engine thread after a re-form."""
        ...

    def pause(self, wake_now: bool, stop: threading.Event) -> None:
        """Sleep with the whole group until a request arrives on any rank (engine thread;
        ``wake_now``: this rank has work already; ``stop``: the replica is stopping)."""
        ...

    def wake(self) -> None:
        """A request was queued on this rank: end the group's pause, if it is in one."""
        ...

    def close(self) -> None:
        """Let go of the wake channel (the replica is shutting down)."""
        ...


class RankRole(Protocol):
    """What a rank does with requests; its Serve methods are the shell's, by role."""

    name: DisaggregationRole

    def after_round(self, outcome: RoundOutcome) -> None:
        """The role's use of a round's outcome (the engine thread): P/D handoffs and
        reservations to their streams; nothing for a fused rank."""
        ...

    async def start(self) -> None:
        """Once rounds run: join what the role needs beyond the group (P/D: the KV link)."""
        ...
