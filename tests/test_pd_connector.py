"""The P/D seam: each role's scheduler holds one KV connector with the whole interface, the
role (not a None attribute) says what the rank is, and a reserved handoff waits in its own
status, passed over by admission like a loading prompt."""

from __future__ import annotations

import pytest
from builders import make_args
from test_pd_roles import make_handoff

from roundgate.actors.control.config import SchedulerConfig
from roundgate.actors.control.decode_role import HandoffIntake
from roundgate.actors.control.handoff import HandoffReleased, KVArrived
from roundgate.actors.control.kv_connector import KVConnector, NoKVConnector
from roundgate.actors.control.prefill_role import PrefillHandoffs
from roundgate.actors.control.request import RequestStatus
from roundgate.actors.control.scheduler import Scheduler
from roundgate.actors.role import DisaggregationRole
from roundgate.gate.permission import ALLOW_ALL

FUSED, PREFILL, DECODE = DisaggregationRole

# The interface's members: its methods and properties, and its attributes.
MEMBERS = sorted(
    {name for name in vars(KVConnector) if not name.startswith("_")}
    | set(KVConnector.__annotations__)
)


def make_scheduler(role: str, num_kv_pages: int = 32) -> Scheduler:
    args = make_args(1, "none", disaggregation_mode=role, num_kv_pages=num_kv_pages)
    return Scheduler(SchedulerConfig.from_args(args).replace(max_model_len=None))


@pytest.mark.parametrize(
    ("role", "kind"),
    [
        ("null", NoKVConnector),
        (FUSED, NoKVConnector),
        (PREFILL, PrefillHandoffs),
        (DECODE, HandoffIntake),
    ],
)
def test_each_role_holds_one_connector_with_the_whole_interface(role: str, kind: type) -> None:
    scheduler = make_scheduler(role)
    assert isinstance(scheduler.connector, kind)
    assert scheduler.role is DisaggregationRole.parse(role)
    assert scheduler.planner.connector is scheduler.connector
    missing = [name for name in MEMBERS if not hasattr(scheduler.connector, name)]
    assert not missing


@pytest.mark.parametrize(
    ("role", "call", "culprit"),
    [
        (FUSED, lambda c: c.add_handoff(make_handoff("h", 4)), "a fused rank takes no handoffs"),
        (FUSED, lambda c: c.check_fits(make_handoff("h", 4)), "a fused rank takes no handoffs"),
        (PREFILL, lambda c: c.add_handoff(make_handoff("h", 4)), "a prefill rank takes no"),
    ],
)
def test_a_connector_refuses_the_end_its_role_does_not_play(role, call, culprit: str) -> None:
    with pytest.raises(ValueError, match=culprit):
        call(make_scheduler(role).connector)


@pytest.mark.parametrize("role", [FUSED, PREFILL, DECODE])
def test_an_idle_connector_has_nothing_in_flight(role: DisaggregationRole) -> None:
    connector = make_scheduler(role).connector
    # Ends for ids nothing holds are ignored, on every role.
    connector.end_transfer(KVArrived("nobody"))
    connector.end_transfer(HandoffReleased("nobody"))
    assert connector.take_handoffs() == []
    assert not connector.is_pinned("nobody") and not connector.waits_on_transfers
    assert (connector.num_waiting_for_decode, connector.num_received) == (0, 0)


def test_a_reserved_handoff_waits_for_remote_kv_and_admission_passes_it_over() -> None:
    scheduler = make_scheduler(DECODE)
    connector = scheduler.connector
    connector.add_handoff(make_handoff("a", 9))
    connector.add_handoff(make_handoff("b", 9))
    plan = scheduler.plan(ALLOW_ALL)
    assert [r.request_id for r in plan.reservations] == ["a", "b"]
    statuses = [scheduler.queues.requests[rid].status for rid in "ab"]
    assert statuses == [RequestStatus.WAITING_FOR_REMOTE_KV] * 2
    assert scheduler.queues.first_schedulable() is None and not scheduler.can_admit
    assert connector.waits_on_transfers and connector.num_received == 2
    connector.end_transfer(KVArrived("a"))
    assert scheduler.queues.requests["a"].status is RequestStatus.DECODING
    assert not connector.waits_on_transfers  # "a" decodes now
