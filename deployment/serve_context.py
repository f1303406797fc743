"""What the ingress asks Ray Serve itself: request ids, and whether the ranks are healthy."""

from __future__ import annotations

import uuid

from roundgate.actors.role import DisaggregationRole


def set_serve_request_id(request_id: str) -> None:
    """Make ``request_id`` (the server's own, unique) the Serve-internal id of this task's
    handle calls.

    Handle calls made while serving an HTTP request inherit its ``internal_request_id``, and
    Ray Serve 2.60's request router indexes pending requests by that id: two calls in flight
    at once under one id (one per prompt of a batched completion, or two clients that sent
    the same ``X-Request-Id``) can leave the second never assigned to a replica. Each choice
    runs in a task of its own (``merge``), so setting the context var here touches only that
    choice. The public ``request_id`` (the client's label) is left as it is.
    """
    from ray.serve.context import _set_request_context

    _set_request_context(_internal_request_id=request_id)


# Each role's rank deployment, by name (health checks, metrics and tests find them so); every
# one serves ``RankReplica``, its role read from its ``--disaggregation-mode``.
RANK_DEPLOYMENT_OF = {
    DisaggregationRole.FUSED: "RankReplica",
    DisaggregationRole.PREFILL: "PrefillRank",
    DisaggregationRole.DECODE: "DecodeRank",
}
RANK_DEPLOYMENTS = tuple(RANK_DEPLOYMENT_OF.values())


def rank_health() -> str | None:
    """None when every rank deployment (fused, or both P/D roles) and every one of its
    replicas is running; else why."""
    from ray import serve

    try:
        apps = serve.status().applications
    except Exception as exc:  # the controller is unreachable
        return f"cannot read the deployment's status ({type(exc).__name__})"
    for app in apps.values():
        found = [(n, app.deployments[n]) for n in RANK_DEPLOYMENTS if n in app.deployments]
        if not found:
            continue
        for name, ranks in found:
            states = {
                str(state.value if hasattr(state, "value") else state): n
                for state, n in ranks.replica_states.items()
            }
            running = states.get("RUNNING", 0)
            others = {k: v for k, v in states.items() if k != "RUNNING" and v}
            if str(getattr(ranks.status, "value", ranks.status)) != "HEALTHY" or others:
                detail = ", ".join(f"{n} {k.lower()}" for k, n in others.items())
                fused = name == RANK_DEPLOYMENT_OF[DisaggregationRole.FUSED]
                what = "rank replicas" if fused else f"{name} replicas"
                return (
                    f"{what} not all healthy ({running} running"
                    + (f", {detail}" if detail else "")
                    + ")"
                )
        return None
    return "no rank deployment found"


def new_request_id() -> str:
    """A fresh id for one HTTP request: the key of its rank requests, its Serve handle calls
    and the response's ``id``.

    Always the server's own. A client's ``X-Request-Id`` is a label, never a key: two clients
    (or one retrying a request it believes lost) may send the same one, and a shared key
    would collide in the router's pending table and in the rank's scheduler, which serve
    every client of the DP group.
    """
    return uuid.uuid4().hex


def client_request_id() -> str | None:
    """The client's ``X-Request-Id`` (Serve's public request id, which its proxy echoes in the
    ``x-request-id`` response header): a label for logs, None outside Serve."""
    try:
        from ray.serve.context import _get_serve_request_context

        return _get_serve_request_context().request_id or None
    except Exception:  # outside a Serve request (tests) there is no context to read
        return None
