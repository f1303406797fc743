"""Serve deployment/configs/pd.yaml in place of the shared deployment, for P/D modules.

The shared session deployment (``conftest.app``) is replaced by the P/D app under the same
application name and port; ``restore`` puts back what the shared deployment served before.
"""

from __future__ import annotations

import copy
from typing import Any

from tests.integration.conftest import REPO, TEST_PORT

URL = f"http://127.0.0.1:{TEST_PORT}"


def pd_config(**args: Any) -> dict[str, Any]:
    """pd.yaml on the test port; ``args`` replace top-level args (a role section merges)."""
    from deployment.local import load_config

    cfg = load_config(REPO / "deployment" / "configs" / "pd.yaml")
    cfg["http_options"]["port"] = TEST_PORT
    base = cfg["applications"][0]["args"]
    for key, value in args.items():
        if key in ("prefill", "decode"):
            base[key] = {**base[key], **value}
        else:
            base[key] = value
    return copy.deepcopy(cfg)


def deploy_pd(**args: Any) -> None:
    """Deploy pd.yaml (with ``args``) and wait until it answers."""
    from deployment.local import deploy, wait_ready

    deploy(pd_config(**args))
    wait_ready(URL)


def role_call(role: str, method: str, *call_args: Any, timeout_s: float = 30.0) -> Any:
    """``method`` on rank 0 of ``role`` (``prefill`` or ``decode``)."""
    from ray import serve

    from actors.control.messages import RankTarget

    handle = serve.get_deployment_handle(f"{role.capitalize()}Rank", app_name="roundgate")
    return getattr(handle, method).remote(RankTarget(0), *call_args).result(timeout_s=timeout_s)


def pools_settled(timeout_s: float = 30.0) -> dict[str, dict[str, Any]]:
    """Both roles' rank 0 once idle: pools intact, no page held (nothing pinned or leaked)."""
    from tests.integration.helpers import wait_for

    def settled() -> dict[str, dict[str, Any]] | None:
        stats = {role: role_call(role, "stats_snapshot") for role in ("prefill", "decode")}
        for role in stats:
            assert role_call(role, "check_pool") is True
        idle = all(s["kv_occupancy"] == 0 and s["running"] == 0 for s in stats.values())
        return stats if idle else None

    return wait_for(settled, timeout_s, "both roles idle with no page held")
