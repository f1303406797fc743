"""``ServerArgs`` is validated once per process a deploy touches, and the context length is one
number everywhere.

A deploy builds the engine args in three kinds of process: the driver (``build_app``), each
ingress replica and each rank replica. Each builds its ``ServerArgs`` once from the flat dict
the driver binds, and nothing downstream (engine core, scheduler, runner, simulator) validates
again.
"""

from __future__ import annotations

import pickle
from collections.abc import Iterator
from typing import Any

import pytest

from roundgate.actors.control.engine_core import EngineCore
from roundgate.actors.control.messages import GenerateRequest
from roundgate.actors.control.request import Request, SamplingParams
from roundgate.actors.role import DisaggregationRole
from roundgate.actors.server_args import ServerArgs
from roundgate.sim.cost_executor import CostExecutor
from roundgate.sim.round_costs import TOY

FUSED = DisaggregationRole.FUSED

APP_ARGS = {"dp_size": 2, "prefill_attempt_interval": 4, "prefill_any_attempt_interval": 16}


@pytest.fixture
def validations(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[ServerArgs]]:
    seen: list[ServerArgs] = []
    original = ServerArgs._validate

    def counted(self: ServerArgs) -> None:
        seen.append(self)
        original(self)

    monkeypatch.setattr(ServerArgs, "_validate", counted)
    yield seen


class FakeRanks:
    def options(self, **_: Any) -> FakeRanks:
        return self


def test_build_app_validates_once(validations: list[ServerArgs]) -> None:
    from roundgate.deployment.app import build_app

    app = build_app(dict(APP_ARGS))
    assert len(validations) == 1
    assert app is not None


def test_the_ingress_validates_once(validations: list[ServerArgs]) -> None:
    from roundgate.deployment.config import AppArgs
    from roundgate.deployment.ingress import Ingress

    bound = AppArgs.model_validate(dict(APP_ARGS)).model_dump()  # what build_app binds
    validations.clear()
    ingress = Ingress(bound, {FUSED: FakeRanks()})
    assert len(validations) == 1
    assert ingress.max_model_len == ingress.engine_args.max_model_len == 4096


def test_a_rank_validates_once_and_the_engine_core_not_again(
    validations: list[ServerArgs],
) -> None:
    bound = ServerArgs(**APP_ARGS).to_dict()  # the rank deployment's init arg
    validations.clear()
    args = ServerArgs(**bound)  # RankReplica.__init__
    core = EngineCore(args, CostExecutor(TOY))
    core.submit(
        GenerateRequest(
            request_id="r", prompt_token_ids=(1, 2, 3), sampling=SamplingParams(max_tokens=2)
        ).to_request()
    )
    core.step()
    assert len(validations) == 1
    assert core.scheduler.max_model_len == args.max_model_len


def test_a_requests_limits_are_checked_once_at_the_ranks_intake(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    core = EngineCore(ServerArgs(**APP_ARGS), CostExecutor(TOY))
    checked: list[str] = []
    check_fits = core.scheduler.check_fits

    def counted(request: Request) -> None:
        checked.append(request.request_id)
        check_fits(request)

    monkeypatch.setattr(core.scheduler, "check_fits", counted)
    core.submit(
        GenerateRequest(
            request_id="r", prompt_token_ids=(1, 2, 3), sampling=SamplingParams(max_tokens=2)
        ).to_request()
    )
    while core.has_local_work:
        core.step()
    assert checked == ["r"]


def test_pickling_crosses_a_process_boundary_without_validating_again(
    validations: list[ServerArgs], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The validated object crosses as itself: unpickled, it neither validates nor reads the
    model's config from disk again, and keeps what was derived from it."""
    args = ServerArgs(**APP_ARGS)
    validations.clear()

    def unread(model: str) -> None:
        raise AssertionError(f"the model's config was read again ({model})")

    monkeypatch.setattr("roundgate.actors.server_args.resolve_model_config", unread)
    back = pickle.loads(pickle.dumps(args))
    assert back == args and validations == []
    assert back.model_config == args.model_config
    assert back.policy_config == args.policy_config
    assert back.build_policy(1) is not None
    assert dict(back.policy_flags) == dict(args.policy_flags)


def test_the_context_length_is_resolved_once_and_shared() -> None:
    from roundgate.deployment.config import AppArgs
    from roundgate.deployment.ingress import Ingress

    args = ServerArgs(max_model_len=1000)
    ingress = Ingress(
        AppArgs.model_validate({"max_model_len": 1000}).model_dump(), {FUSED: FakeRanks()}
    )
    core = EngineCore(args, CostExecutor(TOY))
    assert ingress.max_model_len == core.scheduler.max_model_len == 1000
    with pytest.raises(ValueError, match=r"--max-model-len 5000 exceeds .*\(4096\)"):
        ServerArgs(max_model_len=5000)


def test_frozen() -> None:
    import dataclasses

    args = ServerArgs()
    with pytest.raises(dataclasses.FrozenInstanceError):
        args.dp_size = 2  # type: ignore[misc]
    assert args.replace(dp_size=2, max_num_seqs=8).dp_size == 2 and args.dp_size == 1
