"""Where the cluster's one-of-a-kind actors live: on the head node.

The metrics hub and the KV-event hub are named actors that any process may create first.
Left to Ray, they land wherever that process runs, and a worker node lost under load takes
them with it: every rank keeps pushing into a dead handle and ``/metrics`` loses its series.
The head node holds the GCS (its loss is the cluster's), so they are pinned there through the
resource Ray gives only that node.
"""

from __future__ import annotations

from typing import Any

HEAD_NODE_RESOURCE = "node:__internal_head__"


def on_head_node() -> dict[str, Any]:
    """Actor options that place an actor on the head node."""
    return {"resources": {HEAD_NODE_RESOURCE: 0.001}}
