"""``least-loaded``: the rank with the fewest unfinished requests.

Serve breaks ties by the emptier KV pool (the ranks' reports); the simulator by the lower rank.
"""

from __future__ import annotations

from roundgate.routing.spec import RouterEntry

ROUTER = RouterEntry(
    name="least-loaded",
    summary="the rank with the fewest unfinished requests",
    serve_class="roundgate.deployment.routing.routers:LeastLoadedRouter",
)
