"""``round-robin``: each new request goes to the next rank in a fixed order (the default).

No settings and no policy object: the Serve router (``deployment.routing.routers``) and the
simulator (``sim.router``) each keep their own counter.
"""

from __future__ import annotations

from routing.spec import RouterEntry

ROUTER = RouterEntry(
    name="round-robin",
    summary="each new request to the next rank in a fixed order",
    serve_class="deployment.routing.routers:RoundRobinRouter",
)
