"""Where a request goes: the Serve request routers (``routers``, Ray) over the pure
cache-aware policy (``cache_aware``, no Ray: the simulator imports it)."""
