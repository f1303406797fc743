"""Membership epochs with real gloo process groups: a killed member, a hung one, a joiner.

Each member is its own process (as in a served group), sharing a ``FileStore`` as the
rendezvous store. Every round each member all-gathers one row ``(member index, round)``
through ``TorchGather``; the test checks the rows each epoch's group gathered, who the epochs
were made of, and how each fault ended for every member.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import time
import traceback
from pathlib import Path
from typing import Any

NAMES = ("a", "b", "c", "d")
DEADLINE_S = 90.0  # for the whole scenario: a bound on hangs, not an expectation of speed


def member_main(name: str, plan: dict[str, Any], store_path: str, out: Any) -> None:
    """One member gathering rows through ``ElasticGather``, with the fault ``plan`` injects.

    Reports (name, event, payload) tuples on ``out``: ``rows`` (round, epoch, members, the
    gathered rows), ``reform`` (epoch number, reason), ``fenced``, ``error``.
    """
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    import torch.distributed as dist

    from roundgate.actors.replica.elastic_gather import ElasticGather
    from roundgate.actors.replica.epoch_group import form_group, leave_group
    from roundgate.actors.replica.membership import (
        Fenced,
        TorchStore,
        first_epoch,
        join_request,
        wait_admitted,
    )
    from roundgate.actors.replica.torch_gather import TorchGather

    timeout = plan["collective_timeout_s"]
    store = TorchStore(dist.FileStore(store_path, -1))
    index = NAMES.index(name)
    try:
        if name in plan["start"]:
            epoch = first_epoch(store, "g", name, plan["start"])
        else:
            go = Path(store_path + ".go")  # the test says when: after the fault's re-form
            while not go.exists():
                time.sleep(0.05)
            join_request(store, "g", plan["joins_epoch"], name)
            epoch = wait_admitted(store, "g", plan["joins_epoch"], name, DEADLINE_S)
        form_group(store, epoch, "gloo", timeout)
        gather = ElasticGather(
            store,
            epoch,
            "gloo",
            timeout,
            plan["window_s"],
            TorchGather,
            on_reform=lambda e, reason: out.put((name, "reform", (e.number, reason))),
            poll_s=0.05,
        )
        for r in range(plan["rounds"]):
            if r == plan.get("fault_at"):
                if plan.get("kill") == name:
                    os._exit(1)  # as SIGKILL leaves it: sockets reset, no goodbye
                if plan.get("hang") == name:
                    os.kill(os.getpid(), signal.SIGSTOP)  # woken by the test with SIGCONT
            rows = gather.all_gather((index, r))
            out.put((name, "rows", (r, gather.epoch.number, gather.epoch.members, rows)))
            time.sleep(plan.get("round_s", 0.05))
        leave_group()
    except Fenced as exc:
        out.put((name, "fenced", str(exc)))
    except BaseException:
        out.put((name, "error", traceback.format_exc()))
        raise


def run(plan: dict[str, Any], tmp: Path, names: tuple[str, ...], on_event=None) -> list[tuple]:
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    store_path = str(tmp / "store")
    procs = {n: ctx.Process(target=member_main, args=(n, plan, store_path, out)) for n in names}
    for p in procs.values():
        p.start()
    events = []
    deadline = time.monotonic() + DEADLINE_S
    try:
        while time.monotonic() < deadline:
            if all(not p.is_alive() for p in procs.values()) and out.empty():
                break
            try:
                event = out.get(timeout=0.5)
            except Exception:
                continue
            events.append(event)
            if on_event is not None:
                on_event(event, procs)
    finally:
        for p in procs.values():
            if p.is_alive():
                os.kill(p.pid, signal.SIGCONT)
                p.join(timeout=5)
            if p.is_alive():
                p.kill()
    errors = [e for e in events if e[1] == "error"]
    assert not errors, errors[0][2]
    return events


def of(events: list[tuple], name: str, kind: str) -> list[Any]:
    return [payload for who, what, payload in events if who == name and what == kind]


def by_round(events: list[tuple], name: str) -> dict[int, tuple]:
    return {r: (number, members, rows) for r, number, members, rows in of(events, name, "rows")}


def test_a_killed_member_is_dropped_and_a_joiner_admitted(tmp_path: Path) -> None:
    """c dies mid-epoch 0: a and b notice (a reset, long before the collective timeout),
    re-form as a group of two and gather on; d then joins at a round boundary as epoch 2."""
    plan = {
        "start": ("a", "b", "c"),
        "rounds": 60,
        "fault_at": 3,
        "kill": "c",
        "collective_timeout_s": 600.0,  # a reset must be noticed without it
        "window_s": 1.0,
        "joins_epoch": 2,
        "round_s": 0.1,
    }
    started = time.monotonic()

    def let_d_join_after_the_fault(event, procs) -> None:
        if event[1] == "rows" and event[2][1] == 1:  # a round gathered in epoch 1
            (tmp_path / "store.go").touch()

    events = run(plan, tmp_path, NAMES, let_d_join_after_the_fault)
    assert time.monotonic() - started < 300  # far below the 600 s timeout: noticed by reset
    for name in "ab":
        assert of(events, name, "reform") == [(1, "fault"), (2, "join")]
        rounds = by_round(events, name)
        assert sorted(rounds) == list(range(60))  # no round lost to the re-forms
        assert rounds[0] == (0, ("a", "b", "c"), [(0, 0), (1, 0), (2, 0)])
        assert rounds[3][:2] == (1, ("a", "b"))  # the round of the fault, gathered again
        assert rounds[3][2] == [(0, 3), (1, 3)]
        assert rounds[59][:2] == (2, ("a", "b", "d"))
    # d's first rows are gathered with the members' rows of that same round boundary.
    d_rounds = by_round(events, "d")
    first = d_rounds[0]
    assert first[:2] == (2, ("a", "b", "d")) and first[2][2] == (3, 0)
    assert {row[1] for row in first[2][:2]} <= set(range(60))


def test_a_hung_member_is_excluded_after_the_timeout_and_fenced_when_it_wakes(
    tmp_path: Path,
) -> None:
    """c stops (SIGSTOP) mid-epoch 0: a and b time out, form epoch 1 without it; woken after
    that, c finds its epoch superseded and is fenced instead of rejoining."""
    plan = {
        "start": ("a", "b", "c"),
        "rounds": 8,
        "fault_at": 2,
        "hang": "c",
        "collective_timeout_s": 5.0,
        "window_s": 1.0,
    }
    woken = []

    def wake_c_after_epoch_1(event, procs) -> None:
        if event[1] == "rows" and event[2][1] == 1 and not woken:
            woken.append(True)
            os.kill(procs["c"].pid, signal.SIGCONT)

    events = run(plan, tmp_path, ("a", "b", "c"), wake_c_after_epoch_1)
    for name in "ab":
        assert of(events, name, "reform") == [(1, "fault")]
        rounds = by_round(events, name)
        assert sorted(rounds) == list(range(8))
        assert rounds[2] == (1, ("a", "b"), [(0, 2), (1, 2)])
    assert woken
    fenced = of(events, "c", "fenced")
    assert len(fenced) == 1 and "epoch 1 was formed without c" in fenced[0]
    assert [r for r, *_ in of(events, "c", "rows")] == [0, 1]  # nothing after it stopped
