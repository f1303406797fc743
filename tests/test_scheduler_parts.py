"""The scheduler is one class composed of parts it owns, not mixins sharing ``self``: no class
of the control plane has two bases from this project, none declares another class's state as
bare annotations, and the parts work on the very queues, pool and waits the scheduler holds."""

from __future__ import annotations

import ast
from pathlib import Path

from builders import make_scheduler
from scheduler_rounds import add, decoding, run_round

from actors.control.scheduler import Scheduler
from gate.permission import ALLOW_ALL

CONTROL = Path(__file__).resolve().parents[1] / "actors" / "control"


def _classes() -> list[tuple[str, ast.ClassDef]]:
    found = []
    for path in sorted(CONTROL.glob("*.py")):
        tree = ast.parse(path.read_text())
        found += [(path.name, node) for node in ast.walk(tree) if isinstance(node, ast.ClassDef)]
    return found


def _is_record(node: ast.ClassDef) -> bool:
    """A dataclass or a named tuple: its annotations are its own fields."""
    decorators = [d.func if isinstance(d, ast.Call) else d for d in node.decorator_list]
    names = {d.id if isinstance(d, ast.Name) else getattr(d, "attr", "") for d in decorators}
    bases = {b.id if isinstance(b, ast.Name) else getattr(b, "attr", "") for b in node.bases}
    return "dataclass" in names or bool(bases & {"NamedTuple", "Protocol"})


def test_no_control_class_has_two_project_bases() -> None:
    project = {node.name for _, node in _classes()}
    mixed = {
        f"{name}:{node.name}"
        for name, node in _classes()
        if sum(isinstance(b, ast.Name) and b.id in project for b in node.bases) > 1
    }
    assert not mixed


def test_no_control_class_declares_state_it_does_not_set() -> None:
    stubs = {
        f"{name}:{node.name}.{stmt.target.id}"
        for name, node in _classes()
        if not _is_record(node)
        for stmt in node.body
        if isinstance(stmt, ast.AnnAssign) and stmt.value is None
        if isinstance(stmt.target, ast.Name)
    }
    assert not stubs


def test_the_parts_share_the_schedulers_queues_pool_and_waits() -> None:
    sched = make_scheduler()
    planner, ends, queues = sched.planner, sched.ends, sched.queues
    assert Scheduler.__bases__ == (object,)
    assert planner.queues is ends.queues is queues
    assert planner.pool is ends.pool is sched.pool
    assert planner.waits is ends.waits is sched.waits
    assert planner.ends is ends
    for name in ("waiting", "running", "retracted", "requests"):
        assert getattr(sched, name) is getattr(queues, name)


def test_an_abort_and_a_failure_go_through_the_endings_part() -> None:
    sched = make_scheduler()
    a, b = decoding(sched, 4, 4)
    (waiting,) = add(sched, 4)
    sched.abort(a.request_id)
    sched.ends.fail(b, "injected")
    plan = run_round(sched, ALLOW_ALL)
    assert (sched.num_aborts, sched.num_failures) == (1, 1)
    assert a.finish_reason == "abort" and b.error == "injected"
    assert a.request_id not in sched.requests and b.request_id not in sched.requests
    assert [c.request for c in plan.chunks] == [waiting]
    assert not sched.ends.has_pending
