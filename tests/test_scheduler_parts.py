"""The scheduler is one class composed of parts it owns, not mixins sharing ``self``: the parts
work on the very queues, pool and waits the scheduler holds (``tests/test_layout.py`` checks
that no class has two project bases or annotation-only stand-ins for another's state)."""

from __future__ import annotations

from builders import make_scheduler
from scheduler_rounds import add, decoding, run_round

from roundgate.actors.control.scheduler import Scheduler
from roundgate.gate.permission import ALLOW_ALL


def test_the_parts_share_the_schedulers_queues_pool_and_waits() -> None:
    sched = make_scheduler()
    planner, ends, queues = sched.planner, sched.ends, sched.queues
    assert Scheduler.__bases__ == (object,)
    assert planner.queues is ends.queues is queues
    assert planner.pool is ends.pool is sched.pool
    assert planner.waits is ends.waits is sched.waits
    assert planner.ends is ends
    for name in ("waiting", "running", "retracted", "requests"):
        # One name per queue: ``scheduler.queues.<name>``, never a second binding.
        assert not hasattr(sched, name) and not hasattr(planner, name)


def test_an_abort_and_a_failure_go_through_the_endings_part() -> None:
    sched = make_scheduler()
    a, b = decoding(sched, 4, 4)
    (waiting,) = add(sched, 4)
    sched.abort(a.request_id)
    sched.ends.fail(b, "injected")
    plan = run_round(sched, ALLOW_ALL)
    assert (sched.num_aborts, sched.num_failures) == (1, 1)
    assert a.finish_reason == "abort" and b.error == "injected"
    assert a.request_id not in sched.queues.requests and b.request_id not in sched.queues.requests
    assert [c.request for c in plan.chunks] == [waiting]
    assert not sched.ends.has_pending
