"""``round-robin``: each new request goes to the next rank in a fixed order (the default).

No settings and no policy object: the Serve router (``roundgate.deployment.routing.routers``) and
the simulator (``roundgate.sim.router``) each keep their own counter.
"""

from __future__ import annotations

from roundgate.routing.spec import RouterEntry

ROUTER = RouterEntry(
    name="round-robin",
    summary="each new request to the next rank in a fixed order",
    serve_class="roundgate.deployment.routing.routers:RoundRobinRouter",
)
