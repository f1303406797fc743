"""The P/D link as pairs: one two-member process group per (prefill process, decode process).

Why pairs and not one group of every rank of both roles: a rank that restarts is a new
process, and a group that spans both roles could only take it back if every member re-formed
with it, mid-transfer, whatever the other roles were doing; until then no rank of the link
could move a page. A pair group is formed on the pair's first transfer and named by both
processes' *incarnations* (an id drawn per process), so a restarted rank simply forms new pairs
as it needs them, the old pairs die with the old process, and a pair that cannot form (its
peer gone) fails that one transfer, within the link's timeout, leaving every other pair alone.
This is how KV-transfer libraries connect too (Mooncake, NIXL: point to point per peer).

Presence: every process publishes a record under the link id, its role and its rank in the
rendezvous store (Ray's KV store when served): its incarnation, and for a prefill process
where its pairs meet (a file prefix when the deployment is on one node, otherwise its own
guarded TCP store: on its node's address only, every key behind a token drawn by the process
and published in that record, so only a reader of Ray's KV can form a pair with it). A
decode rank reads the record of the prefill rank that made a handoff before it asks for the
pages: a record of another incarnation means the process that held them is gone
(``SourceLost``), which the ingress treats as a lost rank (the request is prefilled again),
not as the request's own failure.

At start a rank waits until every member of the other role has published once (a peer role
that never starts is a startup error naming it); after that nothing waits for a peer: a role
that restarts finds the other's records already there.
"""

from __future__ import annotations

import json
import os
import tempfile
import threading
import time
import uuid
from dataclasses import asdict, dataclass
from datetime import timedelta
from typing import Protocol

import torch.distributed as dist

from roundgate.actors.replica import guarded_store
from roundgate.actors.replica.kv_link import KVLink, TransferFailed
from roundgate.actors.replica.pd_messages import LinkSpec
from roundgate.actors.role import DisaggregationRole

KEY_PREFIX = "roundgate/pd-link/"
PREFILL_END, DECODE_END = 0, 1  # each pair group's ranks


class PresenceStore(Protocol):
    """Where link members publish themselves (``membership.RayKvStore`` when served)."""

    def put(self, key: str, value: str) -> None: ...

    def get(self, key: str) -> str | None: ...


class SourceLost(TransferFailed):
    """The prefill process that held a handoff's pages is gone (its rank restarted): the
    request must be prefilled again; nothing is wrong with the request itself."""


@dataclass(frozen=True, slots=True)
class Presence:
    """One link member's record: its process's incarnation and (prefill) where pairs meet,
    with the token its store asks of them (TCP)."""

    incarnation: str
    init_method: str = ""
    token: str = ""

    def encode(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def decode(cls, text: str) -> Presence:
        return cls(**json.loads(text))


def presence_key(link_id: str, role: DisaggregationRole, rank: int) -> str:
    return f"{KEY_PREFIX}{link_id}/{role.value}/{rank}"


class LinkPairs:
    """This process's end of the P/D link: its presence, and its pair groups by peer.

    ``pair_with(peer_rank, peer_incarnation)`` returns the pair group with that peer process,
    forming it on first use (both ends must ask; the prefill end does so when the decode rank's
    ``SendKV`` arrives). A newer incarnation of a peer rank replaces the older one's pair.
    """

    def __init__(
        self,
        spec: LinkSpec,
        role: DisaggregationRole,
        rank: int,
        store: PresenceStore,
        *,
        backend: str = "gloo",
        host: str | None = None,
        timeout_s: float = 20.0,
    ) -> None:
        self.spec, self.role, self.rank = spec, role, rank
        self.store, self.backend, self.timeout_s = store, backend, timeout_s
        self.incarnation = uuid.uuid4().hex[:12]
        self._pairs: dict[int, tuple[str, KVLink]] = {}
        self._locks: dict[int, threading.Lock] = {}
        self._guard = threading.Lock()
        self._server: dist.Store | None = None  # the prefill end's store, behind its token
        self._clients: dict[tuple[str, str], dist.Store] = {}  # by (address, token)
        init_method, token = "", ""
        if role is DisaggregationRole.PREFILL:
            if host is None:  # one node: pairs meet through files, no listening socket
                init_method = "file://" + os.path.join(
                    tempfile.gettempdir(), f"roundgate-pd-{spec.link_id}-{self.incarnation}"
                )
            else:
                token = guarded_store.new_token()
                server = guarded_store.serve(host, 0, timeout_s)
                self._server = guarded_store.guard(server, token)
                init_method = f"tcp://{host}:{server.port}"
        self.presence = Presence(self.incarnation, init_method, token)
        store.put(presence_key(spec.link_id, role, rank), self.presence.encode())

    @property
    def peer_role(self) -> DisaggregationRole:
        if self.role is DisaggregationRole.PREFILL:
            return DisaggregationRole.DECODE
        return DisaggregationRole.PREFILL

    def peer_name(self, rank: int) -> str:
        return f"{self.peer_role.value} rank {rank}"

    def my_name(self) -> str:
        return f"{self.role.value} rank {self.rank}"

    def peer(self, rank: int) -> Presence | None:
        """Peer ``rank``'s latest record (None: it never published)."""
        text = self.store.get(presence_key(self.spec.link_id, self.peer_role, rank))
        return None if text is None else Presence.decode(text)

    def wait_for_peers(self, poll_s: float = 0.1) -> None:
        """Block until every rank of the other role published once; ``TimeoutError`` names
        those that did not within the link's timeout."""
        size = (
            self.spec.num_decode
            if self.role is DisaggregationRole.PREFILL
            else self.spec.num_prefill
        )
        deadline = time.monotonic() + self.timeout_s
        while True:
            missing = [r for r in range(size) if self.peer(r) is None]
            if not missing:
                return
            if time.monotonic() > deadline:
                names = ", ".join(self.peer_name(r) for r in missing)
                raise TimeoutError(
                    f"P/D link: {names} did not join within {self.timeout_s:g} s (seen from "
                    f"{self.my_name()}): the peer role is not running or cannot be reached"
                )
            time.sleep(poll_s)

    def current(self, rank: int, incarnation: str) -> Presence:
        """Prefill ``rank``'s record, which must be ``incarnation``'s (decode end); else
        ``SourceLost``: that process is gone, and with it what it held."""
        record = self.peer(rank)
        if record is None or record.incarnation != incarnation:
            raise SourceLost(
                f"{self.peer_name(rank)} restarted (process {incarnation} is gone); the "
                "request's KV pages went with it"
            )
        return record

    def pair_with(self, rank: int, incarnation: str) -> KVLink:
        """The pair group with peer ``rank``'s process ``incarnation``, formed if new (blocks
        until the peer's end forms it too, up to the link's timeout: ``TransferFailed``)."""
        with self._guard:
            lock = self._locks.setdefault(rank, threading.Lock())
        with lock:
            held = self._pairs.get(rank)
            if held is not None and held[0] == incarnation:
                return held[1]
            self._pairs.pop(rank, None)  # an older process of that rank: its pair is dead
            try:
                link = self._form(rank, incarnation)
            except Exception as exc:  # the peer died or never came within the timeout
                raise TransferFailed(
                    f"P/D link: no connection with {self.peer_name(rank)} (process "
                    f"{incarnation}) within {self.timeout_s:g} s: {exc}"
                ) from exc
            self._pairs[rank] = (incarnation, link)
            return link

    def _form(self, peer_rank: int, peer_incarnation: str) -> KVLink:
        if self.role is DisaggregationRole.PREFILL:
            prefill, decode = (self.rank, self.incarnation), (peer_rank, peer_incarnation)
            meets = self.presence
        else:
            prefill, decode = (peer_rank, peer_incarnation), (self.rank, self.incarnation)
            meets = self.current(peer_rank, peer_incarnation)
        pair = f"p{prefill[0]}.{prefill[1]}-d{decode[0]}.{decode[1]}"
        me = PREFILL_END if self.role is DisaggregationRole.PREFILL else DECODE_END
        store = self._pair_store(meets, pair)
        return KVLink(store, me, 2, self.backend, self.timeout_s, name=f"pair {pair}")

    def _pair_store(self, meets: Presence, pair: str) -> dist.Store:
        """The pair's store: its own file (one node), or its keys in the prefill process's
        guarded store, reached with the token of the record the pair was formed from."""
        init_method = meets.init_method
        if init_method.startswith("file://"):
            os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
            store = dist.FileStore(f"{init_method[len('file://') :]}-{pair}", 2)
            store.set_timeout(timedelta(seconds=self.timeout_s))
            return store
        if self._server is not None:
            base: dist.Store = self._server
        else:
            with self._guard:  # one client per prefill process, shared by its pairs
                base = self._clients.get((init_method, meets.token))
                if base is None:
                    host, port = guarded_store.split_tcp(init_method)
                    client = guarded_store.connect(host, port, self.timeout_s)
                    base = guarded_store.guard(client, meets.token)
                    self._clients[(init_method, meets.token)] = base
        return dist.PrefixStore(pair + "/", base)

    @property
    def num_pairs(self) -> int:
        return len(self._pairs)


def join(
    spec: LinkSpec, role: DisaggregationRole, rank: int, device: str, timeout_s: float
) -> LinkPairs:
    """A served rank's end of the link: published in Ray's KV store, peers awaited once."""
    from roundgate.actors.replica.membership import RayKvStore
    from roundgate.actors.replica.node import device_type, multinode_host

    backend = "nccl" if device_type(device) == "cuda" else "gloo"
    pairs = LinkPairs(
        spec, role, rank, RayKvStore(), backend=backend, host=multinode_host(), timeout_s=timeout_s
    )
    pairs.wait_for_peers()
    return pairs
