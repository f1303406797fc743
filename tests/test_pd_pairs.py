"""The P/D link as pairs between real processes (gloo, both rendezvous kinds): a pair forms on
its first transfer and is reused; a prefill rank that restarts is a new process whose pair
forms anew while the decode rank keeps running, and a handoff made by the dead process is
reported lost (to be prefilled again), not failed; a peer that never forms its end fails that
transfer within the timeout; a role whose peers never publish is a startup error naming them."""

from __future__ import annotations

import multiprocessing as mp
import queue
from datetime import timedelta
from typing import Any

import pytest
import torch.distributed as dist
from pd_pairs_peers import SPEC, run_decode, run_prefill

from roundgate.actors.replica.membership import TorchStore
from roundgate.actors.replica.pd_messages import LinkSpec
from roundgate.actors.replica.pd_pairs import LinkPairs, Presence, presence_key
from roundgate.actors.role import DisaggregationRole


class Member:
    """One spawned link member and its inbox."""

    def __init__(self, ctx: Any, target: Any, args: tuple[Any, ...]) -> None:
        self.inbox = ctx.Queue()
        self.proc = ctx.Process(target=target, args=(*args, self.inbox))
        self.proc.start()

    def order(self, *order: Any) -> None:
        self.inbox.put(order)

    def stop(self) -> None:
        self.inbox.put(None)
        self.proc.join(timeout=30)
        assert self.proc.exitcode == 0


def answers(out: Any, *names: str) -> dict[str, tuple[str, Any]]:
    """The next answer of each of ``names`` (members answer in any order)."""
    got = {}
    for _ in names:
        who, what, value = out.get(timeout=60)
        got[who] = (what, value)
    assert sorted(got) == sorted(names), got
    return got


def answer(out: Any, name: str) -> tuple[str, Any]:
    return answers(out, name)[name]


@pytest.mark.parametrize("host", [None, "127.0.0.1"], ids=["file", "tcp"])
def test_pairs_form_on_demand_and_outlive_a_restarted_prefill_rank(host: str | None) -> None:
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    server = dist.TCPStore(
        "127.0.0.1", 0, None, True, timedelta(seconds=30), wait_for_workers=False
    )
    members: list[Member] = []
    try:
        decode = Member(ctx, run_decode, ("decode", server.port, 3.0, out))
        first = Member(ctx, run_prefill, ("prefill-1", server.port, host, 1, out))
        members += [decode, first]
        ups = dict(out.get(timeout=60)[::2] for _ in range(2))
        d_inc, p1 = ups["decode"], ups["prefill-1"]
        for tag, (src, dst) in enumerate([([1, 2], [0, 3]), ([5], [6])], start=1):
            first.order(d_inc, src, tag)
            decode.order(p1, dst, tag)
            got = answers(out, "prefill-1", "decode")
            assert got["prefill-1"] == ("sent", 1)  # one pair, reused
            assert got["decode"] == ("ok", [10_000 + p for p in src])

        first.stop()  # the prefill rank's process ends; a new one takes its rank
        second = Member(ctx, run_prefill, ("prefill-2", server.port, host, 2, out))
        members.append(second)
        what, p2 = answer(out, "prefill-2")
        assert what == "up" and p2 != p1
        decode.order(p1, [4], 3)  # a handoff the first process made: its pages are gone
        what, why = answer(out, "decode")
        assert what == "lost" and "prefill rank 0 restarted" in why
        second.order(d_inc, [7], 4)
        decode.order(p2, [4], 4)
        got = answers(out, "prefill-2", "decode")
        assert got["prefill-2"] == ("sent", 1)
        assert got["decode"] == ("ok", [20_000 + 7])

        # A published process that never forms its end (it hung): that transfer fails alone,
        # within the link's timeout, and the next one with the live process arrives.
        live = live_record(server, p2)
        TorchStore(server).put(
            presence_key(SPEC.link_id, DisaggregationRole.PREFILL, 0),
            Presence("hung", live.init_method, live.token).encode(),
        )
        decode.order("hung", [1], 5)
        what, why = answer(out, "decode")
        assert what == "failed" and "no connection with prefill rank 0" in why
    finally:
        for member in members:
            if member.proc.is_alive():
                member.inbox.put(None)
                member.proc.join(timeout=30)
                if member.proc.is_alive():
                    member.proc.kill()
        with_empty(out)


def live_record(server: dist.TCPStore, incarnation: str) -> Presence:
    """The live prefill process's record: where its pairs meet, and its token."""
    text = TorchStore(server).get(presence_key(SPEC.link_id, DisaggregationRole.PREFILL, 0))
    record = Presence.decode(text or "")
    assert record.incarnation == incarnation
    return record


def with_empty(out: Any) -> None:
    """Drain what a failed test left in the queue (so its feeder thread can exit)."""
    try:
        while True:
            out.get_nowait()
    except queue.Empty:
        pass


def test_a_peer_role_that_never_publishes_is_named() -> None:
    store = TorchStore(dist.HashStore())
    spec = LinkSpec(link_id="lonely", num_prefill=2, num_decode=1)
    pairs = LinkPairs(spec, DisaggregationRole.DECODE, 0, store, timeout_s=0.3)
    LinkPairs(spec, DisaggregationRole.PREFILL, 1, store, timeout_s=0.3)
    with pytest.raises(TimeoutError) as err:
        pairs.wait_for_peers(poll_s=0.05)
    assert str(err.value) == (
        "P/D link: prefill rank 0 did not join within 0.3 s (seen from decode rank 0): the "
        "peer role is not running or cannot be reached"
    )


def test_a_restarted_peer_replaces_its_record() -> None:
    store = TorchStore(dist.HashStore())
    spec = LinkSpec(link_id="restart", num_prefill=1, num_decode=1)
    decode = LinkPairs(spec, DisaggregationRole.DECODE, 0, store, timeout_s=0.3)
    old = LinkPairs(spec, DisaggregationRole.PREFILL, 0, store, timeout_s=0.3)
    assert decode.current(0, old.incarnation).incarnation == old.incarnation
    new = LinkPairs(spec, DisaggregationRole.PREFILL, 0, store, timeout_s=0.3)
    assert new.incarnation != old.incarnation
    assert decode.current(0, new.incarnation).init_method == new.presence.init_method
    with pytest.raises(Exception, match="prefill rank 0 restarted") as err:
        decode.current(0, old.incarnation)
    assert type(err.value).__name__ == "SourceLost"
