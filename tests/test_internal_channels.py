"""Our multi-node channels serve their own group only, with real torch stores and sockets.

Each store (a DP group's rendezvous, the group's wake keys in it, a prefill process's P/D
link store) listens on the address its group was told to meet at, not on every interface,
and serves the group's keys only to a client that presents the group's token. The outsider
here knows everything but the token (our code is public: key names, the pair naming, a
published incarnation) and reaches the store's address; it can neither join the group, nor
read, write or wait on the group's keys, nor form a P/D pair. The members still meet.

Addresses: loopback aliases (``127.0.0.2``) stand for a node's IP, so "another address of
the same machine" is ``127.0.0.1`` (Linux routes all of ``127.0.0.0/8`` to loopback).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import socket
import threading
from datetime import timedelta
from typing import Any

import pytest
import torch
import torch.distributed as dist
from test_group_wake import ONE_CYCLE_S, one_cycle

from roundgate.actors.replica import group_wake, guarded_store, rendezvous
from roundgate.actors.replica.group_wake import open_group_wake
from roundgate.actors.replica.kv_link import KVLink, TransferFailed
from roundgate.actors.replica.membership import TorchStore
from roundgate.actors.replica.pd_messages import LinkSpec
from roundgate.actors.replica.pd_pairs import DECODE_END, LinkPairs
from roundgate.actors.role import DisaggregationRole

NODE_IP = "127.0.0.2"  # the node's address the group meets at
OTHER_IP = "127.0.0.1"  # another address of the same machine
DEADLINE_S = 60.0  # how long a test waits for a member (a bound on hangs, not a speed)
OUTSIDER_S = 3.0  # how long the outsider tries before it gives up


@pytest.fixture(autouse=True)
def _loopback_alias(monkeypatch: pytest.MonkeyPatch) -> None:
    try:
        guarded_store.bind_socket(NODE_IP).close()
    except OSError:
        pytest.skip(f"{NODE_IP} is not a local address here (Linux's loopback alias)")
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "lo")


def reaches(host: str, port: int) -> bool:
    """A raw TCP connect: does anything listen at ``(host, port)``?"""
    try:
        socket.create_connection((host, port), timeout=DEADLINE_S).close()
        return True
    except ConnectionRefusedError:
        return False


def outsider(host: str, port: int) -> dist.TCPStore:
    """A client of the store that speaks torch's protocol but has no token."""
    return dist.TCPStore(host, port, None, False, timedelta(seconds=OUTSIDER_S))


def _member(meeting: rendezvous.Meeting, rank: int, out: Any) -> None:
    """A group member: joins through ``rendezvous.join``, then sums its ``rank + 1``."""
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    try:
        rendezvous.join(meeting, rank, 2, DEADLINE_S)
        total = torch.tensor([rank + 1])
        dist.all_reduce(total)
        out.put((f"rank {rank}", int(total.item())))
        dist.destroy_process_group()
    except Exception as exc:
        out.put((f"rank {rank}", f"failed: {exc}"))


def _outsider_joins(init_method: str, out: Any) -> None:
    """Joins as rank 1 the way torch's ``tcp://`` rendezvous does, knowing no token."""
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    try:
        dist.init_process_group(
            "gloo",
            init_method=init_method,
            rank=1,
            world_size=2,
            timeout=timedelta(seconds=OUTSIDER_S),
        )
        out.put(("outsider", "joined"))
    except Exception as exc:
        out.put(("outsider", f"failed: {type(exc).__name__}"))


def test_rendezvous_binds_the_node_address_and_admits_only_token_holders() -> None:
    meeting = rendezvous.choose_meeting("channels", "gloo", NODE_IP)
    _, port = guarded_store.split_tcp(meeting.init_method)
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_member, args=(meeting, 0, out))]
    procs[0].start()
    try:
        # Rank 0 is up and waits for rank 1; the outsider takes rank 1's place first.
        procs.append(ctx.Process(target=_outsider_joins, args=(meeting.init_method, out)))
        procs[1].start()
        assert out.get(timeout=DEADLINE_S) == ("outsider", "failed: DistStoreError")
        # Rank 0's store listens on the meeting's address only.
        assert reaches(NODE_IP, port)
        assert not reaches(OTHER_IP, port), "the rendezvous store listens on every address"
        procs.append(ctx.Process(target=_member, args=(meeting, 1, out)))
        procs[2].start()
        got = dict(out.get(timeout=DEADLINE_S) for _ in range(2))
        assert got == {"rank 0": 3, "rank 1": 3}  # the members met, and only they
    finally:
        for proc in procs:
            proc.join(timeout=DEADLINE_S)
            if proc.is_alive():
                proc.kill()


def test_the_store_keeps_the_groups_keys_from_an_outsider() -> None:
    server = guarded_store.serve(NODE_IP, 0, DEADLINE_S)
    meeting = rendezvous.Meeting(f"tcp://{NODE_IP}:{server.port}", "gloo", "a" * 32)
    member = rendezvous.open_store(meeting, False, DEADLINE_S)
    member.set("roundgate/x", b"member")
    stranger = outsider(NODE_IP, server.port)
    assert not stranger.check(["roundgate/x"])  # cannot read it
    stranger.set("roundgate/x", b"junk")  # writes a key of its own, beside the group's
    assert member.get("roundgate/x") == b"member"
    assert stranger.num_keys() >= 2  # what it can still see: how many keys there are
    wrong = guarded_store.guard(outsider(NODE_IP, server.port), "b" * 32)
    assert not wrong.check(["roundgate/x"])  # a guessed token names other keys


def test_an_outsider_can_neither_wake_nor_watch_the_group(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(group_wake, "STOP_CHECK_S", ONE_CYCLE_S)
    server = guarded_store.serve(NODE_IP, 0, DEADLINE_S)
    meeting = rendezvous.Meeting(
        f"tcp://{NODE_IP}:{server.port}", "gloo", guarded_store.new_token()
    )
    rank0, rank1 = (open_group_wake(meeting, "g", rank, 2) for rank in range(2))
    stranger = outsider(NODE_IP, server.port)
    stranger.set("roundgate/wake/g/1", b"1")  # the wake key of pause 1, by name
    assert not one_cycle(rank0, 1), "an outsider's key ended the group's pause"
    rank1.wake(1)
    assert one_cycle(rank0, 1)
    assert stranger.get("roundgate/wake/g/1") == b"1"  # its own key, not the group's
    rank1.wake(2)
    assert not stranger.check(["roundgate/wake/g/2"])  # a member's wake is not visible


def test_a_prefill_store_forms_pairs_with_members_only() -> None:
    spec = LinkSpec(link_id="channels", num_prefill=1, num_decode=1)
    presence = TorchStore(dist.HashStore())
    prefill = LinkPairs(
        spec, DisaggregationRole.PREFILL, 0, presence, host=NODE_IP, timeout_s=OUTSIDER_S
    )
    host, port = guarded_store.split_tcp(prefill.presence.init_method)
    assert host == NODE_IP and reaches(NODE_IP, port)
    assert not reaches(OTHER_IP, port), "the P/D link store listens on every address"

    # The outsider knows the prefill process's incarnation and how pairs are named.
    pair = f"p0.{prefill.incarnation}-d0.intruder"
    stranger = dist.PrefixStore(pair + "/", outsider(NODE_IP, port))
    results: dict[str, Any] = {}

    def intrude() -> None:
        try:
            KVLink(stranger, DECODE_END, 2, "gloo", OUTSIDER_S)
            results["outsider"] = "paired"
        except Exception as exc:
            results["outsider"] = f"failed: {type(exc).__name__}"

    thread = threading.Thread(target=intrude)
    thread.start()
    with pytest.raises(TransferFailed, match="no connection with decode rank 0"):
        prefill.pair_with(0, "intruder")
    thread.join(DEADLINE_S)
    assert results == {"outsider": "failed: DistStoreError"}

    # A decode rank that read the prefill's record (token included) forms its pair.
    decode = LinkPairs(spec, DisaggregationRole.DECODE, 0, presence, timeout_s=DEADLINE_S)
    prefill.timeout_s = DEADLINE_S  # the outsider's wait is over: members get the full bound
    formed: dict[str, Any] = {}
    ends = [
        threading.Thread(target=lambda: formed.update(p=prefill.pair_with(0, decode.incarnation))),
        threading.Thread(target=lambda: formed.update(d=decode.pair_with(0, prefill.incarnation))),
    ]
    for end in ends:
        end.start()
    for end in ends:
        end.join(DEADLINE_S)
    assert sorted(formed) == ["d", "p"]
