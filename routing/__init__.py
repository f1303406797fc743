"""Where a request goes: the routing policies (no Ray) and the routers' registry.

The Serve request routers (``roundgate.deployment.routing``) and the simulator
(``roundgate.sim.router``) both run these policies; ``registry`` lists every router with its
settings, so the serve config, the command lines and the Serve router classes are derived from
one declaration per router.
"""
