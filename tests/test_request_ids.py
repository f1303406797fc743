"""Request ids a client can influence never stop a rank's round loop.

Every entry of ``EngineCore`` and ``Scheduler`` that takes an id is driven with a duplicate, an
unknown and an already-aborted id, beside an ordinary request: the loop keeps stepping, the
ordinary request finishes with all its tokens, and the pool stays whole. The HTTP side keys
rank requests by the server's own ids (``new_request_id``), so the client's ``X-Request-Id``
never reaches these entries; this is the rank's own defence.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from builders import make_args, make_request

from roundgate.actors.control.engine_core import EngineCore
from roundgate.actors.control.request import RequestStatus
from roundgate.deployment.serve_context import client_request_id, new_request_id
from roundgate.sim.cost_executor import CostExecutor
from roundgate.sim.round_costs import TOY

MAX_TOKENS = 6


def make_core() -> EngineCore:
    return EngineCore(make_args(1, "none", num_kv_pages=64), CostExecutor(TOY))


def run_until_done(core: EngineCore, rounds: int = 60) -> None:
    for _ in range(rounds):
        core.step()
        if not core.has_local_work:
            return
    raise AssertionError("the rank never drained")


def submit_twice_queued(core: EngineCore) -> None:
    core.submit(make_request("x", prompt_len=4, max_tokens=MAX_TOKENS))
    core.submit(make_request("x", prompt_len=4, max_tokens=MAX_TOKENS))


def submit_twice_running(core: EngineCore) -> None:
    core.submit(make_request("x", prompt_len=4, max_tokens=MAX_TOKENS))
    core.step()
    core.submit(make_request("x", prompt_len=4, max_tokens=MAX_TOKENS))


def add_twice_to_the_scheduler(core: EngineCore) -> None:
    core.scheduler.add_request(make_request("x", prompt_len=4, max_tokens=MAX_TOKENS))
    core.scheduler.add_request(make_request("x", prompt_len=4, max_tokens=MAX_TOKENS))


def bypass_submit_with_a_duplicate(core: EngineCore) -> None:
    # A caller that skips ``submit``'s check: the duplicate reaches the engine thread itself.
    core.submit(make_request("x", prompt_len=4, max_tokens=MAX_TOKENS))
    core.step()
    core._queued_prompts.append(make_request("x", prompt_len=4, max_tokens=MAX_TOKENS))


def abort_unknown(core: EngineCore) -> None:
    core.abort("never-sent")
    core.scheduler.abort("never-sent-either")


def abort_twice(core: EngineCore) -> None:
    core.submit(make_request("x", prompt_len=4, max_tokens=MAX_TOKENS))
    core.step()
    core.abort("x")
    core.abort("x")
    core.step()
    core.abort("x")


def abort_while_queued(core: EngineCore) -> None:
    core.submit(make_request("x", prompt_len=4, max_tokens=MAX_TOKENS))
    core.abort("x")
    core.abort("x")


def mark_loaded_unknown_and_aborted(core: EngineCore) -> None:
    core.scheduler.mark_loaded("never-sent")
    core.scheduler.add_request(make_request("x", prompt_len=4, max_tokens=MAX_TOKENS), True)
    core.abort("x")
    core.step()
    core.scheduler.mark_loaded("x")


def submit_after_finish(core: EngineCore) -> None:
    core.submit(make_request("x", prompt_len=4, max_tokens=2))
    run_until_done(core)
    core.submit(make_request("x", prompt_len=4, max_tokens=2))  # the id is free again


ATTACKS: dict[str, Callable[[EngineCore], None]] = {
    "submit twice while queued": submit_twice_queued,
    "submit twice while running": submit_twice_running,
    "add_request twice": add_twice_to_the_scheduler,
    "duplicate past submit": bypass_submit_with_a_duplicate,
    "abort an unknown id": abort_unknown,
    "abort twice, and after the abort": abort_twice,
    "abort while queued": abort_while_queued,
    "mark_loaded unknown and aborted": mark_loaded_unknown_and_aborted,
    "reuse a finished id": submit_after_finish,
}


@pytest.mark.parametrize("attack", list(ATTACKS), ids=list(ATTACKS))
def test_no_id_stops_the_round_loop(attack: str) -> None:
    core = make_core()
    plain = make_request("plain", prompt_len=8, max_tokens=MAX_TOKENS)
    core.submit(plain)
    try:
        ATTACKS[attack](core)
    except ValueError as exc:
        # Refusals happen on the caller's thread, at the call, naming the id.
        assert "'x'" in str(exc)
    run_until_done(core)
    assert plain.status is RequestStatus.FINISHED_LENGTH
    assert len(plain.output_token_ids) == MAX_TOKENS
    core.scheduler.pool.check_integrity()
    assert core.scheduler.pool.num_free_pages == core.scheduler.pool.num_pages


@pytest.mark.parametrize("steps_between", [0, 1, 3])
def test_submit_refuses_a_live_id_and_the_first_runs_to_its_end(steps_between: int) -> None:
    core = make_core()
    first = make_request("x", prompt_len=4, max_tokens=MAX_TOKENS)
    second = make_request("x", prompt_len=5, max_tokens=MAX_TOKENS)
    core.submit(first)
    for _ in range(steps_between):
        core.step()
    with pytest.raises(ValueError, match="'x' is already in use on this rank"):
        core.submit(second)
    run_until_done(core)
    assert first.status is RequestStatus.FINISHED_LENGTH
    assert len(first.output_token_ids) == MAX_TOKENS
    assert second.output_token_ids == [] and second.status is RequestStatus.WAITING
    assert core.scheduler.num_failures == 0


def test_server_ids_are_fresh_and_the_client_label_is_only_a_label() -> None:
    ids = {new_request_id() for _ in range(1000)}
    assert len(ids) == 1000
    assert client_request_id() is None  # outside a Serve request there is no client label
