"""The scheduler hands out the pages the runner allocated: under --gpu-memory-utilization the
runner sizes the KV cache after the weights, and an engine built from the flags' page count
would schedule pages the cache does not have (or leave most of it unused)."""

from __future__ import annotations

import pytest

from roundgate.actors import engine as engine_module
from roundgate.actors.model import runner as runner_module
from roundgate.actors.server_args import ServerArgs


class SizedRunner(runner_module.ModelRunner):
    """The real runner, reporting the pool a memory budget would have given it."""

    @property
    def args(self) -> ServerArgs:
        return super().args.replace(num_kv_pages=24)


def test_the_offline_engine_schedules_the_runners_pages(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runner_module, "ModelRunner", SizedRunner)
    engine = engine_module.Engine(ServerArgs(model="tiny-llama", device="cpu", num_kv_pages=64))
    assert engine.core.scheduler.pool.config.num_pages == 24
