"""``vllm-lb``: vLLM's internal data-parallel load balancer, as the simulator models it.

Least ``4 x waiting + running`` on counts refreshed every 100 ms, one view per API server
(``roundgate.sim.vllm_lb`` has the model and its sources). Simulated only: the yardstick the
``gb200-dsv3`` cost preset was fitted with, not a router this deployment serves with.
"""

from __future__ import annotations

from roundgate.routing.spec import Option, RouterEntry

LB_API_SERVERS = Option(
    "lb_api_servers",
    int,
    None,
    "API servers, each balancing on its own view (default 1; vLLM starts --dp-size of them "
    "under internal load balancing)",
    minimum=1,
)

ROUTER = RouterEntry(
    name="vllm-lb",
    summary="vLLM's internal load balancer: least 4 x waiting + running on stale counts",
    options=(LB_API_SERVERS,),
    serve=False,
)
