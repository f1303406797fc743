"""A prefill rank releases a handoff no decode rank asked for within --handoff-timeout-s: the
pure deadlines, and the prefill role over a real engine core (the cost executor), whose pages
come back to the pool, while a handoff a decode rank claimed in time is never released under
its transfer."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest
from builders import make_args, make_request

from roundgate.actors.control.engine_core import EngineCore
from roundgate.actors.control.handoff_expiry import HandoffExpiry
from roundgate.actors.replica.pd_messages import LinkSpec, ReleaseHandoff, SendKV
from roundgate.actors.replica.prefill_role import PrefillRole
from roundgate.actors.server_args import ServerArgs
from roundgate.actors.telemetry.metrics import RankMetricSet
from roundgate.actors.telemetry.transfer_metrics import TransferMetrics
from roundgate.sim.cost_executor import CostExecutor
from roundgate.sim.round_costs import TOY

TIMEOUT_S = 480.0


def test_deadlines_expire_in_order_once_each() -> None:
    expiry = HandoffExpiry(10.0)
    expiry.pinned("a", 0.0)
    expiry.pinned("b", 5.0)
    expiry.pinned("c", 6.0)
    assert expiry.expired(9.9) == [] and expiry.next_deadline() == 10.0
    assert expiry.ended("b") is True  # a decode rank asked: off the clock
    assert expiry.expired(16.0) == ["a", "c"]
    assert expiry.expired(100.0) == [] and len(expiry) == 0
    assert expiry.ended("a") is False  # expired already: its pages must not be read


def test_a_handoff_pinned_again_gets_a_fresh_deadline() -> None:
    expiry = HandoffExpiry(10.0)
    expiry.pinned("a", 0.0)
    expiry.pinned("b", 1.0)
    expiry.pinned("a", 5.0)  # a resumed request handed off again under the same id
    assert expiry.expired(11.0) == ["b"]
    assert expiry.expired(15.0) == ["a"]


@pytest.mark.parametrize("bad", [0, -1.0, float("nan")])
def test_a_timeout_that_is_not_positive_is_refused_by_its_flag(bad: float) -> None:
    with pytest.raises(ValueError, match="--handoff-timeout-s"):
        HandoffExpiry(bad)
    with pytest.raises(ValueError, match="--handoff-timeout-s"):
        ServerArgs(handoff_timeout_s=bad)


@dataclass
class _Pair:
    sent: list[Any] = field(default_factory=list)

    def send(self, cache: Any, page_ids: Any, end: int, tag: int) -> int:
        self.sent.append(cache)
        return 0 if cache is None else 64 * len(page_ids)


class _Link:
    """The P/D link as the role sees it: its process id and one pair (records each send)."""

    incarnation = "p1"

    def __init__(self) -> None:
        self.pair = _Pair()

    def pair_with(self, rank: int, incarnation: str) -> _Pair:
        return self.pair


class _Engine:
    """What the prefill role reads of its rank engine, around a real engine core."""

    def __init__(self, core: EngineCore) -> None:
        self.core = core
        self.args = core.args
        self.runner = SimpleNamespace(cache="the KV cache")
        self.callers: set[str] = set()

    def deliver(self, stream_id: str, item: Any) -> bool:
        return stream_id in self.callers


def make_role() -> tuple[PrefillRole, EngineCore, RankMetricSet, list[float]]:
    args = make_args(
        dp_size=1, policy="none", disaggregation_mode="prefill", handoff_timeout_s=TIMEOUT_S
    )
    core = EngineCore(args, CostExecutor(TOY))
    metrics = RankMetricSet()
    transfers = TransferMetrics(metrics, "g", "m", 0, "prefill")
    engine = _Engine(core)
    role = PrefillRole(
        engine, None, lambda: None, transfers, LinkSpec(link_id="l", num_prefill=1, num_decode=1)
    )  # type: ignore[arg-type]
    role.link = _Link()  # type: ignore[assignment]
    now = [1000.0]
    role.clock = lambda: now[0]
    return role, core, metrics, now


def hand_off(role: PrefillRole, core: EngineCore, request_id: str) -> None:
    role.engine.callers.add(request_id)  # type: ignore[attr-defined]
    core.submit(make_request(request_id, prompt_len=10, max_tokens=4))
    outcome = core.step()
    assert [h.request_id for h in outcome.handoffs] == [request_id]
    role.after_round(outcome)


def send_order(request_id: str) -> SendKV:
    """A decode rank's ``send_kv`` for ``request_id`` to this prefill process."""
    return SendKV(
        request_id=request_id,
        page_ids=(0, 1, 2),
        dst_rank=0,
        dst_incarnation="d1",
        tag=1,
        dp_rank=0,
        source_incarnation="p1",
    )


def expired_count(metrics: RankMetricSet) -> float:
    return metrics.pd_handoffs_expired.labels("g", "m", "0", "prefill")._value.get()


def test_an_orphaned_handoff_is_released_after_the_timeout_and_its_pages_come_back() -> None:
    role, core, metrics, now = make_role()
    hand_off(role, core, "orphan")
    pool = core.scheduler.pool
    assert pool.num_used_pages > 0 and core.connector.is_pinned("orphan")
    now[0] += TIMEOUT_S - 1
    assert role.expire(now[0]) == []
    core.step()
    assert core.connector.is_pinned("orphan")  # still inside its bound
    now[0] += 2
    assert role.expire(now[0]) == ["orphan"]
    core.step()  # the release applies at the next round
    assert not core.connector.is_pinned("orphan") and pool.num_used_pages == 0
    pool.check_integrity()
    assert expired_count(metrics) == 1


def test_a_decode_rank_asking_after_the_release_fails_that_request_without_reading_pages() -> None:
    role, core, _, now = make_role()
    hand_off(role, core, "late")
    now[0] += TIMEOUT_S + 1
    role.expire(now[0])
    order = send_order("late")
    assert asyncio.run(role.send_kv(order)) == 0
    assert role.link.pair.sent == [None]  # told the receiver it failed; no page was read


def test_a_handoff_claimed_in_time_is_never_released_by_the_clock() -> None:
    role, core, metrics, now = make_role()
    hand_off(role, core, "sent")
    hand_off(role, core, "dropped")
    order = send_order("sent")
    assert asyncio.run(role.send_kv(order)) > 0
    assert role.link.pair.sent == ["the KV cache"]
    asyncio.run(role.release_handoff(ReleaseHandoff(request_id="dropped", dp_rank=0)))
    now[0] += 10 * TIMEOUT_S
    assert role.expire(now[0]) == [] and expired_count(metrics) == 0
