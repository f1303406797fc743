"""Membership epochs as a protocol over a store: who is in the next epoch, and who is fenced.

Members run as threads on one ``torch.distributed.HashStore`` (the real store class a served
group's rendezvous mirrors); the real process groups are in ``test_membership_gloo.py``.
"""

from __future__ import annotations

import threading

import pytest
import torch.distributed as dist

from roundgate.actors.replica.membership import (
    Epoch,
    Fenced,
    TorchStore,
    current_number,
    first_epoch,
    join_request,
    joiners,
    next_epoch,
    order,
    wait_admitted,
)

MEMBERS = ("a", "b", "c")


@pytest.fixture
def store() -> TorchStore:
    return TorchStore(dist.HashStore())


def run_all(targets: dict[str, object]) -> dict[str, object]:
    """Run each member's function in a thread; their results (or exceptions) by member."""
    out: dict[str, object] = {}

    def run(name: str, fn) -> None:
        try:
            out[name] = fn()
        except Exception as exc:  # a member's failure is its result here
            out[name] = exc

    threads = [threading.Thread(target=run, args=(n, f)) for n, f in targets.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    return out


def test_order_keeps_survivors_ranks_and_appends_joiners() -> None:
    assert order(["a", "b", "c", "d"], ["d", "x", "b", "y"]) == ["b", "d", "x", "y"]
    assert order(["a"], ["a", "a"]) == ["a"]


def test_first_epoch_is_the_started_list(store: TorchStore) -> None:
    epochs = [first_epoch(store, "g", m, MEMBERS) for m in MEMBERS]
    assert [e.rank for e in epochs] == [0, 1, 2] and {e.number for e in epochs} == {0}


def test_survivors_agree_without_the_dead_member_after_the_window(store: TorchStore) -> None:
    start = {m: first_epoch(store, "g", m, MEMBERS) for m in MEMBERS}
    # "b" is dead: it never registers. The others wait the window, then agree.
    got = run_all({m: (lambda m=m: next_epoch(store, start[m], window_s=0.3)) for m in "ac"})
    assert got["a"] == Epoch("g", 1, ("a", "c"), "a")
    assert got["c"] == Epoch("g", 1, ("a", "c"), "c") and got["c"].rank == 1


def test_the_wait_ends_as_soon_as_every_expected_member_registered(store: TorchStore) -> None:
    start = {m: first_epoch(store, "g", m, MEMBERS) for m in MEMBERS}
    # A window of a minute: if the wait did not end early, the threads would outlive join's
    # timeout and the results would be missing.
    got = run_all({m: (lambda m=m: next_epoch(store, start[m], window_s=60.0)) for m in MEMBERS})
    assert {e.members for e in got.values()} == {MEMBERS}
    # Told who is dead, survivors do not wait for it at all.
    got = run_all(
        {m: (lambda m=m: next_epoch(store, got[m], 60.0, expected=("a", "c"))) for m in "ac"}
    )
    assert got["a"].members == ("a", "c") and got["a"].number == 2


def test_a_member_that_wakes_after_the_decision_is_fenced(store: TorchStore) -> None:
    start = {m: first_epoch(store, "g", m, MEMBERS) for m in MEMBERS}
    run_all({m: (lambda m=m: next_epoch(store, start[m], window_s=0.2)) for m in "ab"})
    with pytest.raises(Fenced, match="epoch 1 was formed without c"):
        next_epoch(store, start["c"], window_s=0.2)
    assert current_number(store, "g") == 1


def test_a_joiner_is_seen_at_a_round_boundary_and_admitted(store: TorchStore) -> None:
    start = {m: first_epoch(store, "g", m, ("a", "b")) for m in "ab"}
    assert joiners(store, start["a"]) == []
    join_request(store, "g", 1, "d")
    assert joiners(store, start["a"]) == ["d"] == joiners(store, start["b"])
    got = run_all(
        {m: (lambda m=m: next_epoch(store, start[m], window_s=5.0)) for m in "ab"}
        | {"d": lambda: wait_admitted(store, "g", 1, "d", timeout_s=5.0)}
    )
    assert got["d"] == Epoch("g", 1, ("a", "b", "d"), "d") and got["d"].rank == 2
    assert got["a"].members == got["b"].members == ("a", "b", "d")


def test_a_group_of_one_forms_its_own_epoch(store: TorchStore) -> None:
    only = first_epoch(store, "g", "a", ("a", "b"))
    assert next_epoch(store, only, window_s=0.1) == Epoch("g", 1, ("a",), "a")


def test_groups_do_not_see_each_others_epochs(store: TorchStore) -> None:
    g1 = first_epoch(store, "g1", "a", ("a",))
    g2 = first_epoch(store, "g2", "a", ("a", "b"))
    join_request(store, "g2", 1, "z")
    assert joiners(store, g1) == [] and joiners(store, g2) == ["z"]


def test_an_unadmitted_joiner_times_out_naming_the_epoch(store: TorchStore) -> None:
    with pytest.raises(TimeoutError, match="epoch 1 not decided"):
        wait_admitted(store, "g", 1, "d", timeout_s=0.1)


def test_a_group_whose_members_all_died_is_taken_over_by_its_joiner(store: TorchStore) -> None:
    """Its only member died at its first round (it never admitted anyone): a replacement
    would wait for ever; once the member's heartbeat is stale, the joiner forms the next
    epoch itself. While the member still beats, the joiner waits and times out instead."""
    from roundgate.actors.replica import seats
    from roundgate.actors.replica.elastic_member import ElasticSpec, enter, group_id

    spec = ElasticSpec("dep", num_groups=1)
    group = group_id(spec, 0)
    first_epoch(store, group, "dead", ["dead"])
    seats.beat(store, "dep", "dead", now=0.0)  # long ago
    seat = seats.claim(store, "dep", 1, 2, "new")
    epoch = enter(store, spec, seat, "new", timeout_s=10.0, stale_s=30.0, poll_s=0.05)
    assert epoch == Epoch(group, 1, ("new",), "new")
    # A live member (it beats) is waited for: no takeover, a timeout naming the epoch.
    first_epoch(store, "dep-g9", "alive", ["alive"])
    seats.beat(store, "dep", "alive")
    with pytest.raises(TimeoutError, match="epoch 1 not decided"):
        enter(store, ElasticSpec("dep", 10), seats.Seat(9, 1), "other", 0.3, 30.0, 0.05)
