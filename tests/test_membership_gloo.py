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
    """One member: epoch 0 of ``plan['start']``, then what ``plan`` says for this member.

    Reports (name, event, payload) tuples on ``out``: ``epoch`` (number, members), ``rows``
    (the rows gathered in an epoch), ``noticed`` (seconds from its gather call to the error),
    ``fenced``, ``error``.
    """
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    import torch.distributed as dist

    from actors.replica.epoch_group import form_group, leave_group
    from actors.replica.membership import (
        Fenced,
        TorchStore,
        first_epoch,
        join_request,
        joiners,
        next_epoch,
        wait_admitted,
    )
    from actors.replica.torch_gather import TorchGather

    timeout = plan["collective_timeout_s"]
    store = TorchStore(dist.FileStore(store_path, -1))
    index = NAMES.index(name)

    def rounds(epoch, count: int, fault_at: int | None = None) -> None:
        """``count`` gathers in ``epoch``; an injected fault at round ``fault_at``."""
        gather = TorchGather()
        rows = []
        for r in range(count):
            if r == fault_at:
                if plan.get("kill") == name:
                    os._exit(1)  # as SIGKILL leaves it: sockets reset, no goodbye
                if plan.get("hang") == name:
                    os.kill(os.getpid(), signal.SIGSTOP)  # woken by the test with SIGCONT
            rows.append(gather.all_gather((index, epoch.number, r)))
            # A joiner seen at a round boundary ends the epoch for every member at once.
            if plan.get("admit") == epoch.number and joiners(store, epoch):
                out.put((name, "rows", (epoch.number, rows)))
                raise _EndEpoch
        out.put((name, "rows", (epoch.number, rows)))

    try:
        if name in plan["start"]:
            epoch = first_epoch(store, "g", name, plan["start"])
        else:
            join_request(store, "g", plan["joins_epoch"], name)
            epoch = wait_admitted(store, "g", plan["joins_epoch"], name, DEADLINE_S)
        while True:
            out.put((name, "epoch", (epoch.number, epoch.members)))
            form_group(store, epoch, "gloo", timeout)
            try:
                fault = plan.get("fault_at") if epoch.number == 0 else None
                rounds(epoch, plan["rounds"], fault)
                if epoch.number >= plan["last_epoch"]:
                    break
                raise _EndEpoch
            except (_EndEpoch, RuntimeError) as exc:
                if isinstance(exc, RuntimeError):
                    out.put((name, "noticed", type(exc).__name__))
                epoch = next_epoch(store, epoch, window_s=plan["window_s"])
        leave_group()
    except Fenced as exc:
        out.put((name, "fenced", str(exc)))
    except BaseException:
        out.put((name, "error", traceback.format_exc()))
        raise


class _EndEpoch(Exception):
    """The members agreed to move on (a joiner is waiting)."""


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


def test_a_killed_member_is_dropped_and_a_joiner_admitted(tmp_path: Path) -> None:
    """c dies mid-epoch 0: a and b notice (a reset, long before the collective timeout),
    form epoch 1 as a group of two, and then admit d as epoch 2 at a round boundary."""
    plan = {
        "start": ("a", "b", "c"),
        "rounds": 4,
        "fault_at": 2,
        "kill": "c",
        "collective_timeout_s": 600.0,  # a reset must be noticed without it
        "window_s": 1.0,
        "joins_epoch": 2,
        "admit": 1,
        "last_epoch": 2,
    }
    started = time.monotonic()
    events = run(plan, tmp_path, NAMES)
    assert time.monotonic() - started < 300  # far below the 600 s timeout: noticed by reset
    for name in "ab":
        assert of(events, name, "epoch") == [
            (0, ("a", "b", "c")),
            (1, ("a", "b")),
            (2, ("a", "b", "d")),
        ]
        assert of(events, name, "noticed") == ["RuntimeError"]
    assert of(events, "d", "epoch") == [(2, ("a", "b", "d"))]
    # Epoch 1 gathered the two survivors' rows; epoch 2 all three, ranks in member order.
    for name in "abd":
        rows = dict(of(events, name, "rows"))
        assert rows[2] == [[(0, 2, r), (1, 2, r), (3, 2, r)] for r in range(4)]
    assert dict(of(events, "a", "rows"))[1][0] == [(0, 1, 0), (1, 1, 0)]


def test_a_hung_member_is_excluded_after_the_timeout_and_fenced_when_it_wakes(
    tmp_path: Path,
) -> None:
    """c stops (SIGSTOP) mid-epoch 0: a and b time out, form epoch 1 without it; woken after
    that, c finds its epoch superseded and is fenced instead of rejoining."""
    plan = {
        "start": ("a", "b", "c"),
        "rounds": 3,
        "fault_at": 1,
        "hang": "c",
        "collective_timeout_s": 5.0,
        "window_s": 1.0,
        "last_epoch": 1,
    }
    woken = []

    def wake_c_after_epoch_1(event, procs) -> None:
        if event[1] == "rows" and event[2][0] == 1 and not woken:
            woken.append(True)
            os.kill(procs["c"].pid, signal.SIGCONT)

    events = run(plan, tmp_path, ("a", "b", "c"), wake_c_after_epoch_1)
    for name in "ab":
        assert of(events, name, "epoch") == [(0, ("a", "b", "c")), (1, ("a", "b"))]
        assert dict(of(events, name, "rows"))[1] == [[(0, 1, r), (1, 1, r)] for r in range(3)]
    assert woken
    fenced = of(events, "c", "fenced")
    assert len(fenced) == 1 and "epoch 1 was formed without c" in fenced[0]
    assert of(events, "c", "rows") == []  # c gathered nothing after it stopped
