"""A rank's composed parts without Ray: the group pause, the role dispatch, a fused role over
the engine's streams, and P/D's one pairing rule."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from roundgate.actors.control.engine_core import EngineCore
from roundgate.actors.control.messages import GenerateRequest
from roundgate.actors.control.request import SamplingParams
from roundgate.actors.pd_roles import MUST_MATCH, check_pair, role_server_args
from roundgate.actors.replica.fused_role import FusedRole
from roundgate.actors.replica.group_wake import GroupPause
from roundgate.actors.replica.intake import PromptIntake
from roundgate.actors.replica.rank_engine import GroupUnavailable, RankEngine
from roundgate.actors.replica.rank_parts import RoleMismatch, served_by
from roundgate.actors.role import DisaggregationRole
from roundgate.actors.server_args import ServerArgs
from roundgate.sim.cost_executor import CostExecutor
from roundgate.sim.round_costs import TOY

PREFILL, DECODE = DisaggregationRole.PREFILL, DisaggregationRole.DECODE
BASE = {"model": "tiny-llama", "page_size": 4, "num_kv_pages": 64, "device": "cpu"}


class Channel:
    """A ``GroupWake`` that records what it was asked and never blocks."""

    def __init__(self) -> None:
        self.woken: list[int] = []
        self.waited: list[int] = []
        self.closed = False

    def wait(self, epoch: int, stop: Any) -> bool:
        self.waited.append(epoch)
        return True

    def wake(self, epoch: int) -> None:
        self.woken.append(epoch)

    def close(self) -> None:
        self.closed = True


class OneRank:
    """The membership of a group of one that never pauses."""

    rank = row_rank = 0
    gang_id = "g"

    def __init__(self) -> None:
        self.wakes = 0

    def wake(self) -> None:
        self.wakes += 1


@pytest.mark.parametrize(("wake_now", "woken"), [(False, []), (True, [1])])
def test_a_pause_wakes_its_own_group_only_when_it_has_work(wake_now: bool, woken: list) -> None:
    channel = Channel()
    pause = GroupPause(channel)
    pause.pause(wake_now, lambda epoch: None)
    assert (channel.waited, channel.woken, pause.paused_at) == ([1], woken, None)


def test_a_request_wakes_the_pause_it_finds_once_and_none_after() -> None:
    channel = Channel()
    pause = GroupPause(channel)
    pause.wake()  # running rounds: nothing to wake
    pause.paused_at = pause.epoch = 3
    pause.wake()
    pause.wake()  # the same pause: already woken
    assert channel.woken == [3]


def test_a_new_groups_channel_counts_pauses_afresh_and_closes_the_old() -> None:
    old, new = Channel(), Channel()
    pause = GroupPause(old)
    pause.pause(False, lambda epoch: None)
    pause.replace(new)
    pause.pause(False, lambda epoch: None)
    assert old.closed and (old.waited, new.waited) == ([1], [1])


@pytest.mark.parametrize(
    ("kind", "method", "message"),
    [
        (FusedRole, "generate", "generate\\(\\) is a fused rank's method; this rank's role is "),
    ],
)
def test_a_method_of_another_role_is_refused_naming_both(kind: type, method: str, message: str):
    class Prefill:
        name = PREFILL

    with pytest.raises(RoleMismatch, match=message + "prefill"):
        served_by(Prefill(), kind, method)


def run_fused(messages: list[GenerateRequest], fail: bool = False) -> list[list[Any]]:
    """Each message's chunks from a fused role over a ``RankEngine`` whose rounds a task runs."""
    args = ServerArgs(**BASE)
    group = OneRank()

    async def go() -> list[list[Any]]:
        engine = RankEngine(args, group)
        engine.core = EngineCore(args, CostExecutor(TOY), on_event=engine.on_event)
        role = FusedRole(PromptIntake(engine, None, group.wake, lambda request_id: None))
        stop = asyncio.Event()

        async def rounds() -> None:
            while not stop.is_set():
                if engine.core.has_local_work:
                    engine.core.step()
                    engine.outbox.send()
                await asyncio.sleep(0)

        async def collect(message: GenerateRequest) -> list[Any]:
            return [chunk async for chunk in role.generate(message)]

        stepper = asyncio.create_task(rounds())
        try:
            return list(await asyncio.gather(*(collect(m) for m in messages)))
        finally:
            stop.set()
            await stepper
            # One wake per request submitted (a refused duplicate never reached the engine).
            assert group.wakes == len({m.request_id for m in messages})
            assert engine.streams == {}

    return asyncio.run(go())


def message(request_id: str, max_tokens: int = 3) -> GenerateRequest:
    sampling = SamplingParams(max_tokens=max_tokens)
    return GenerateRequest(request_id=request_id, prompt_token_ids=(5, 6, 7), sampling=sampling)


def test_a_fused_role_streams_each_requests_tokens_and_closes_its_stream() -> None:
    (chunks,) = run_fused([message("a", max_tokens=3)])
    assert sum(len(c.token_ids) for c in chunks) == 3
    assert chunks[-1].finish_reason == "length"


def test_a_second_stream_of_one_id_is_refused_alone() -> None:
    first, second = run_fused([message("a"), message("a")])
    assert first[-1].finish_reason == "length"
    assert second[0].finish_reason == "error" and "already streaming" in second[0].error


def test_a_failed_group_refuses_new_requests_as_unavailable() -> None:
    args = ServerArgs(**BASE)

    async def go() -> None:
        engine = RankEngine(args, OneRank())
        engine.core = EngineCore(args, CostExecutor(TOY), on_event=engine.on_event)
        role = FusedRole(PromptIntake(engine, None, lambda: None, lambda request_id: None))
        engine.fail(RuntimeError("peer reset"))
        with pytest.raises(GroupUnavailable, match="peer reset"):
            await anext(role.generate(message("a")))

    asyncio.run(go())


def test_both_roles_are_built_from_the_shared_flags_and_their_sections() -> None:
    sections = {PREFILL: {"dp_size": 1}, DECODE: {"dp_size": 2, "max_num_seqs": 8}}
    prefill, decode = role_server_args(BASE, sections)
    assert (prefill.disaggregation_mode, decode.disaggregation_mode) == (PREFILL, DECODE)
    assert (prefill.dp_size, decode.dp_size, decode.max_num_seqs) == (1, 2, 8)


@pytest.mark.parametrize(
    ("decode", "culprit"),
    [
        ({"page_size": 8}, "prefill.page_size 4 and decode.page_size 8 differ"),
        ({"seed": 7}, "both roles must have the same --seed"),
        ({"max_model_len": 64}, "--max-model-len"),
        ({"num_kv_pages": 0}, "decode role: "),  # the role's own validation names the role
    ],
)
def test_the_pairing_rule_names_the_field(decode: dict, culprit: str) -> None:
    with pytest.raises(ValueError, match=culprit):
        role_server_args(BASE, {PREFILL: {}, DECODE: decode})


def test_the_pairing_rule_checks_each_sides_mode() -> None:
    fused = ServerArgs(**BASE)
    with pytest.raises(ValueError, match="the prefill role needs --disaggregation-mode prefill"):
        check_pair(fused, fused.replace(disaggregation_mode="decode"))
    assert {"model", "page_size", "max_model_len"} <= set(MUST_MATCH)
