"""What the ingress asks Ray Serve itself: request ids, and whether the ranks are healthy."""

from __future__ import annotations

import uuid


def set_serve_request_id(request_id: str) -> None:
    """Make ``request_id`` the Serve request id of this task's handle calls.

    Handle calls made while serving an HTTP request inherit its ``internal_request_id``, and
    Ray Serve 2.60's request router indexes pending requests by that id: two calls in flight
    at once from one HTTP request (one per prompt of a batched completion) can leave the
    second one never assigned to a replica, hanging the response. Each choice runs in a task
    of its own (``merge``), so setting the context var here touches only that choice, and
    Serve's logs of the call show the choice's id.
    """
    from ray.serve.context import _set_request_context

    _set_request_context(request_id=request_id, _internal_request_id=request_id)


def rank_health() -> str | None:
    """None when the rank deployment and every one of its replicas is running; else why."""
    from ray import serve

    try:
        apps = serve.status().applications
    except Exception as exc:  # the controller is unreachable
        return f"cannot read the deployment's status ({type(exc).__name__})"
    for app in apps.values():
        ranks = app.deployments.get("RankReplica")
        if ranks is None:
            continue
        states = {
            str(state.value if hasattr(state, "value") else state): n
            for state, n in ranks.replica_states.items()
        }
        running = states.get("RUNNING", 0)
        others = {k: v for k, v in states.items() if k != "RUNNING" and v}
        if str(getattr(ranks.status, "value", ranks.status)) != "HEALTHY" or others:
            detail = ", ".join(f"{n} {k.lower()}" for k, n in others.items())
            return (
                f"rank replicas not all healthy ({running} running"
                + (f", {detail}" if detail else "")
                + ")"
            )
        return None
    return "no rank deployment found"


def http_request_id() -> str:
    """The id Serve gave this HTTP request (the client's ``X-Request-Id`` when it sent one,
    and Serve's ``x-request-id`` response header): the one id of the request from the
    proxy's log to the rank's scheduler. Outside Serve (tests), a fresh one."""
    try:
        from ray.serve.context import _get_serve_request_context

        request_id = _get_serve_request_context().request_id
    except ImportError:  # pragma: no cover - Serve is a dependency
        request_id = ""
    return request_id or uuid.uuid4().hex
