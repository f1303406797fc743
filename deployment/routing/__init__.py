"""Where a request goes in Serve: the request routers (``routers``) and the live KV-event hub
(``kv_hub``), the Ray side of the routing policies in ``routing`` (which the simulator runs too)."""
