"""One local Ray cluster and one roundgate deployment for the whole integration session.

The deployment is ``deployment/configs/local.yaml`` (dp=2, gate on) with the tiny MoE preset in
place of the real default model, on a test port, so a developer's own ``make serve`` on 8000 is
left alone; the ``test_served_*`` modules ask for local.yaml's own model (``real_model``).
Integration tests run after every unit test, so the cluster (started by the first of them)
never competes with unit tests. Tests that need other settings redeploy the same application
name and restore the default afterwards (``redeploy``). The P/D modules come last: their
deployment (``pd_app``) takes the shared app's place for the rest of the session.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from helpers import BackgroundStream

REPO = Path(__file__).resolve().parents[2]
TEST_PORT = int(os.environ.get("ROUNDGATE_TEST_PORT", "18765"))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Integration tests after every unit test; among them, the modules that use ``pd_app``
    last (each module kept whole and in order), since pd.yaml replaces the shared app for good,
    and before them those that use ``real_model``, which keeps its model to the end. After all
    of them, the multi-node module (``two_nodes``), which ends the session's one-node cluster
    to start its own.
    """
    here = Path(__file__).parent
    integration = [item for item in items if here in Path(item.fspath).parents]
    for item in integration:
        item.add_marker(pytest.mark.integration)
    pd_modules = {item.fspath for item in integration if "pd_app" in item.fixturenames}
    real_modules = {item.fspath for item in integration if "real_model" in item.fixturenames}
    multinode = {item.fspath for item in integration if "two_nodes" in item.fixturenames}
    # Stable: order kept within each group.
    integration.sort(
        key=lambda item: (
            item.fspath in multinode,
            item.fspath in pd_modules,
            item.fspath in real_modules,
        )
    )
    chosen = {id(item) for item in integration}
    items[:] = [item for item in items if id(item) not in chosen] + integration


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[None]:
    from roundgate.deployment.local import start_local_cluster

    start_local_cluster(num_cpus=4)
    import ray
    from ray import serve

    yield
    from roundgate.deployment.local import shutdown

    if ray.is_initialized():  # the multi-node module may have ended it already
        shutdown(serve, ray)


@pytest.fixture(scope="session")
def local_config() -> dict[str, Any]:
    from roundgate.deployment.local import load_config

    cfg = load_config(REPO / "deployment" / "configs" / "local.yaml")
    cfg["http_options"]["port"] = TEST_PORT
    # The shared deployment swaps the real default model for the tiny preset, so the load,
    # fault and fuzz tests fit two cores; test_served_default_model.py serves local.yaml as it is.
    cfg["applications"][0]["args"]["model"] = "tiny-moe"
    # tiny-moe shards its experts across the group, so the shared app keeps whole-group
    # restart (the fault tests' subject); test_elastic_dp.py serves a dense model elastically.
    cfg["applications"][0]["args"]["elastic_dp"] = False
    return cfg


class Deployment:
    """Handle to the running app: its URL, the rank handle, and a redeploy helper."""

    def __init__(self, cfg: dict[str, Any]) -> None:
        self.cfg = cfg
        self.url = f"http://127.0.0.1:{TEST_PORT}"
        self.overrides: dict[str, Any] = {}

    @property
    def args(self) -> dict[str, Any]:
        return {**self.cfg["applications"][0]["args"], **self.overrides}

    def deploy(self, **overrides: Any) -> None:
        from ray import serve

        from roundgate.deployment.local import deploy, wait_ready

        self.overrides = overrides
        deploy(self.cfg, overrides)
        self.ranks = serve.get_deployment_handle("RankReplica", app_name="roundgate")
        wait_ready(self.url)

    def restore_after_faults(self) -> None:
        """The default app again, after a module that killed rank replicas.

        Ray Serve 2.60 can lose track of a replacement rank replica that started just before
        a redeploy (its controller logs "Found stale ranks ... This should never happen"):
        the replica stays alive, holding its CPUs, and later modules' replicas cannot be
        scheduled. So the app is deleted first, and any rank replica of it still alive (one
        of those) is killed, before the default app is deployed.
        """
        import ray
        from ray import serve

        serve.delete("roundgate")
        prefixes = tuple(f"SERVE_REPLICA::roundgate#{name}#" for name in RANK_CLASSES)
        for actor in ray.util.list_named_actors(all_namespaces=True):
            if actor["name"].startswith(prefixes):
                with contextlib.suppress(ValueError):  # (it ended meanwhile)
                    ray.kill(ray.get_actor(actor["name"], namespace=actor["namespace"]))
        self.deploy()

    def rank_call(self, method: str, rank: int, timeout_s: float = 30.0) -> Any:
        from roundgate.actors.control.messages import RankTarget

        return getattr(self.ranks, method).remote(RankTarget(rank)).result(timeout_s=timeout_s)


@pytest.fixture(scope="session")
def app(ray_cluster: None, local_config: dict[str, Any]) -> Deployment:
    dep = Deployment(local_config)
    dep.deploy()
    return dep


REAL_MODEL = "smollm2-135m-instruct"
RANK_CLASSES = ("RankReplica", "PrefillRank", "DecodeRank")  # the rank deployments' names


@pytest.fixture(scope="session")
def real_model(app: Deployment) -> Deployment:
    """The shared deployment with local.yaml's own model, deployed once for every module that
    needs it (``test_served_*``, which sort after the tiny-preset modules) and kept to the end
    of the session: putting the tiny preset back then would serve nobody. Elastic, as
    local.yaml ships it (the model is dense)."""
    app.deploy(model=REAL_MODEL, elastic_dp=True)
    return app


@pytest.fixture(scope="session")
def pd_app(real_model: Deployment) -> Any:
    """pd.yaml as shipped (one prefill and one decode rank of the real default model), deployed
    once for every P/D module in place of the shared app, after the fused deployment answered
    the comparison's requests (``pd_deploy.replace_with_pd``). The modules using it run last
    (``pytest_collection_modifyitems``), so the fused app is not put back."""
    from pd_deploy import replace_with_pd

    return replace_with_pd(real_model)


@pytest.fixture
def redeploy(app: Deployment) -> Iterator[Deployment]:
    """Lets a test run the app with other args; the default config is restored after."""
    yield app
    if app.overrides:
        app.deploy()


@pytest.fixture(scope="module")
def in_flight(app) -> Iterator[BackgroundStream]:
    """A long greedy stream on rank 0, flowing through one module's bad-input cases."""
    stream = BackgroundStream(
        app.url, prompt=[5, 6, 7], max_tokens=3000, ignore_eos=True, temperature=0, dp_rank=0
    )
    assert stream.started.wait(60)
    yield stream
    stream.close()


@pytest.fixture(scope="module")
def http(app) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=app.url, timeout=60) as client:
        yield client
