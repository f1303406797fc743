"""How a rank replica of an elastic deployment enters its group (after taking a seat).

Outside a gang, nothing tells a replica which group it is in: it takes a seat (``seats``),
which names the group and its stable ``dp_rank``. The first replica to reach an empty group
starts it alone (epoch 0) and serves at once; every later one, a replacement included,
registers to join the group's next epoch and waits until the members admit it at a round
boundary (``membership``). A dense group therefore serves from its first rank on and grows as
the others load.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from roundgate.actors.replica import seats
from roundgate.actors.replica.membership import (
    Epoch,
    Fenced,
    MembershipStore,
    current_number,
    decide,
    decided_members,
    first_epoch,
    join_request,
    order,
    registered,
    wait_admitted,
)


@dataclass(frozen=True)
class ElasticSpec:
    """What the app tells an elastic rank: the deployment's id (fresh per deploy, so a
    redeploy never meets the last one's seats or epochs), its groups, the re-form window."""

    deployment: str
    num_groups: int
    window_s: float = 2.0
    spread: bool = False  # gang_placement: spread (seats chosen by node, ``seats.claim``)


def group_id(spec: ElasticSpec, group: int) -> str:
    return f"{spec.deployment}-g{group}"


def enter(
    store: MembershipStore,
    spec: ElasticSpec,
    seat: seats.Seat,
    me: str,
    timeout_s: float,
    stale_s: float = 30.0,
    poll_s: float = 1.0,
) -> Epoch:
    """Start the seat's group or be admitted to it; ``TimeoutError`` when the members do not
    admit this replica within ``timeout_s``.

    A group whose every member has stopped saying it is alive for ``stale_s`` (all died, for
    example at their first round) admits nobody: the joiners then form its next epoch among
    themselves, as its members would have.
    """
    group = group_id(spec, seat.group)
    try:
        return first_epoch(store, group, me, [me])
    except Fenced:
        pass  # the group runs already: join it
    deadline = time.monotonic() + timeout_s
    number = current_number(store, group) + 1
    join_request(store, group, number, me)
    while True:
        try:
            return wait_admitted(store, group, number, me, poll_s)
        except Fenced:
            # That epoch formed without us (decided before our request was seen): the next.
            number = current_number(store, group, number) + 1
            join_request(store, group, number, me)
            continue
        except TimeoutError:
            if time.monotonic() >= deadline:
                raise
        members = decided_members(store, group, number - 1)
        now = time.time()
        if members and not any(
            seats.alive(store, spec.deployment, m, stale_s, now) for m in members
        ):
            # Nobody is left to admit us: decide the epoch with whoever registered for it.
            proposal = order(members, registered(store, group, number))
            decide(store, group, number, proposal)
