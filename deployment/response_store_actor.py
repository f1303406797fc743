"""The Responses store every ingress replica shares: one named, detached Ray actor on the head
node, holding a ``ResponseStore`` and writing it through to a SQLite file beside it.

Why an actor, and why there (docs/responses-api.md): the ingress replicas are Serve actors
that come and go (a scale-down, a redeploy, a node lost), so the store lives outside them, in
one process they all reach by name; on the head node, whose loss ends the cluster anyway, so
the store is lost only with everything else. Ray restarts it if its process dies
(``max_restarts=-1``), and it reloads its snapshot (``roundgate.deployment.openai.
response_snapshot``), in the Ray session's directory: a fresh cluster starts with an empty
store, a restarted actor with everything it held.

Detached, so it outlives the application: a redeploy (or another application on the same
cluster) reuses it by name, and ``serve shutdown`` leaves it (no CPU, a few MiB);
``ray stop`` ends it. Its methods are the table's own, called one at a time (a plain actor:
each call is atomic).
"""

from __future__ import annotations

import logging
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

from roundgate.deployment.openai.response_snapshot import ResponseSnapshot
from roundgate.deployment.openai.response_store import ResponseStore, StoredResponse
from roundgate.deployment.openai.stored_responses import StoredResponses

if TYPE_CHECKING:
    from ray.actor import ActorHandle

STORE_ACTOR_NAME = "roundgate-response-store"
STORE_NAMESPACE = "roundgate"
SNAPSHOT_FILE = "roundgate-responses.sqlite"
STARTUP_TIMEOUT_S = 60.0
logger = logging.getLogger(__name__)


def session_snapshot_path() -> Path | None:
    """The snapshot's place: this Ray session's directory on the head node (None outside a
    Ray worker: no snapshot)."""
    from ray._private import worker  # the session directory has no public accessor

    node = getattr(worker, "_global_node", None)
    return None if node is None else Path(node.get_session_dir_path()) / SNAPSHOT_FILE


class ResponseStoreActor:
    """The shared store's actor: ``ResponseStore``'s calls, each written through to the
    snapshot before it answers."""

    def __init__(self, snapshot_path: str | None = None, snapshot: bool = True) -> None:
        """``snapshot_path``: the SQLite file (default: in the Ray session's directory);
        ``snapshot``: False keeps the table in memory only (a benchmark's baseline)."""
        self.incarnation = uuid.uuid4().hex  # a new one after each restart
        path = Path(snapshot_path) if snapshot_path else session_snapshot_path()
        path = path if snapshot else None
        self.store = ResponseStore(journal=path is not None)
        self.snapshot = ResponseSnapshot(path) if path is not None else None
        if self.snapshot is not None:
            loaded = self.snapshot.load_into(self.store)
            logger.info("response store: %d responses reloaded from %s", loaded, path)

    def ping(self) -> str:
        """This incarnation of the actor (a restart answers another)."""
        return self.incarnation

    def get(self, response_id: str) -> StoredResponse | None:
        return self._saved(self.store.get(response_id))  # a lease may have expired

    def put(self, response_id: str, stored: StoredResponse) -> bool:
        return self._saved(self.store.put(response_id, stored))

    def finish(self, response_id: str, stored: StoredResponse) -> bool:
        return self._saved(self.store.finish(response_id, stored))

    def cancel(self, response_id: str) -> tuple[StoredResponse | None, bool]:
        return self._saved(self.store.cancel(response_id))

    def delete(self, response_id: str) -> bool:
        return self._saved(self.store.delete(response_id))

    def renew(self, owner: str, response_ids: list[str]) -> list[str]:
        return self._saved(self.store.renew(owner, response_ids))

    def _saved(self, answer: Any) -> Any:
        if self.snapshot is not None:
            self.snapshot.save(self.store)
        return answer


def shared_store_actor() -> ActorHandle:
    """The store's actor, created by whichever ingress replica asks first (get-or-create by
    name: replicas starting together get the one actor)."""
    import ray

    from roundgate.actors.head_node import on_head_node

    return (
        ray.remote(ResponseStoreActor)
        .options(
            name=STORE_ACTOR_NAME,
            namespace=STORE_NAMESPACE,
            lifetime="detached",
            get_if_exists=True,
            max_restarts=-1,
            num_cpus=0,
            **on_head_node(),
        )
        .remote()
    )


def shared_responses(timeout_s: float = STARTUP_TIMEOUT_S) -> StoredResponses:
    """The ingress's client of the shared store, its actor made (or found) and answering:
    a replica whose store cannot start fails to start, naming it, rather than answering
    every Responses request 503."""
    import ray

    actor = shared_store_actor()
    try:
        ray.get(actor.ping.remote(), timeout=timeout_s)
    except ray.exceptions.GetTimeoutError:
        raise RuntimeError(
            f"the Responses store's actor ({STORE_NAMESPACE}/{STORE_ACTOR_NAME}, on the head "
            f"node) did not start within {timeout_s:g} s"
        ) from None
    return StoredResponses(actor=actor)
