"""The two rank deployments of a P/D app: a prefill group and a decode group, one link.

Both are ``RankReplica`` (its role read from each group's ``--disaggregation-mode``), named
``PrefillRank`` and ``DecodeRank`` for health checks and metrics. Each role is a Serve gang of
its ``dp_size`` ranks (its own DP group, restarted together), or with ``elastic_dp`` an elastic
group of plain replicas (seats and epochs of its own: a dead rank costs only itself, as in a
fused deployment); both join one P/D link
(``actors/replica/kv_link.py``) under an id drawn here, so a redeployed app never meets the old
one's ranks. The prefill role routes a prompt to the rank with the fewest uncached tokens, the
decode role to the least-loaded rank: by default on the ingress's guess (the cache-aware index
of what it sent) and Serve's request counts; under ``router: kv-aware`` on what both roles'
ranks publish to the KV-event hub (``roundgate.deployment.pd_config``).
"""

from __future__ import annotations

import uuid
from typing import Any

from ray import serve
from ray.serve.config import RequestRouterConfig

from roundgate.actors.replica.pd_messages import LinkSpec
from roundgate.actors.replica.rank_replica import RankReplica
from roundgate.actors.role import DisaggregationRole
from roundgate.deployment.config import AppArgs
from roundgate.deployment.routing.routers import ROUTER_CLASSES
from roundgate.deployment.serve_context import RANK_DEPLOYMENT_OF


def build_roles(cfg: AppArgs) -> tuple[Any, Any]:
    """The bound (prefill, decode) deployments of a validated P/D ``cfg``."""
    prefill = cfg.role_args(DisaggregationRole.PREFILL)
    decode = cfg.role_args(DisaggregationRole.DECODE)
    link = LinkSpec(
        link_id=uuid.uuid4().hex, num_prefill=prefill.dp_size, num_decode=decode.dp_size
    )

    deployment = uuid.uuid4().hex[:12]

    def elastic(role: DisaggregationRole, timeout_s: float) -> dict[str, Any] | None:
        """The role's elastic spec (``elastic_dp``): its own seats and epochs, per deploy."""
        if not cfg.elastic_dp:
            return None
        return {
            "deployment": f"{deployment}-{role.value}",
            "num_groups": 1,
            "spread": cfg.gang_placement == "spread",
            "window_s": min(2.0, max(0.5, timeout_s / 4)),
        }

    def options(role: DisaggregationRole, dp_size: int, timeout_s: float) -> dict[str, Any]:
        return {
            "name": RANK_DEPLOYMENT_OF[role],
            "num_replicas": dp_size,
            "max_ongoing_requests": cfg.max_ongoing_requests,
            "ray_actor_options": cfg.rank_actor_options(*cfg.role_resources(role)),
            **cfg.placement(dp_size, elastic=cfg.elastic_dp),
            "request_router_config": RequestRouterConfig(
                request_router_class=ROUTER_CLASSES[cfg.pd_router(role)],
                request_router_kwargs=cfg.pd_router_kwargs(role),
                request_routing_stats_period_s=0.5,
            ),
            "health_check_period_s": 2.0,
            "health_check_timeout_s": max(10.0, timeout_s),
            "graceful_shutdown_timeout_s": 5.0,
        }

    prefill_app = serve.deployment(
        RankReplica,
        **options(DisaggregationRole.PREFILL, prefill.dp_size, prefill.collective_timeout_s),
    ).bind(
        cfg.rank_args(DisaggregationRole.PREFILL),
        elastic(DisaggregationRole.PREFILL, prefill.collective_timeout_s),
        link=link,
    )
    decode_app = serve.deployment(
        RankReplica,
        **options(DisaggregationRole.DECODE, decode.dp_size, decode.collective_timeout_s),
    ).bind(
        cfg.rank_args(DisaggregationRole.DECODE),
        elastic(DisaggregationRole.DECODE, decode.collective_timeout_s),
        link=link,
        prefill=prefill_app,
    )
    return prefill_app, decode_app
