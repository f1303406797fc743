"""A torch TCP store only its own group can use: bound to one address, its keys behind a token.

torch's ``TCPStore`` listens on every interface and serves any client that speaks its
protocol; it has no authentication to hook into. What every multi-node channel of ours (the
rendezvous of a DP group, the group's wake keys, the P/D link's pair stores) uses instead:

- **One address.** The master listens on the address its group was told to meet at (the
  node's IP), not on ``0.0.0.0``/``::``: we bind the socket ourselves and hand its fd to the
  store (``master_listen_fd``), so nothing else on the node's other interfaces reaches it.
- **A token.** Every key the group reads or writes lives under a per-group secret (128 random
  bits) published only with the meeting in Ray's internal KV, which Ray's token
  authentication guards. The store has no command that lists keys, so a client without the
  token cannot name one of the group's keys: it can neither read, overwrite, wait on nor
  delete them, and cannot join a process group formed over the store (gloo and NCCL exchange
  their addresses and ids through those keys).

What it leaves open, as torch's protocol does: anyone who reaches the address can connect,
count the keys (``num_keys``), write keys of its own (memory) and hold connections open.
That is denial of service, not access; the NetworkPolicy (or a firewall) is the guard there.
"""

from __future__ import annotations

import secrets
import socket
from datetime import timedelta
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch is imported where a store is made: this module's callers load early
    import torch.distributed as dist

TOKEN_BYTES = 16  # 128 bits: not guessable through a store that answers one key at a time


def new_token() -> str:
    """A fresh group token (hex), drawn once by whoever creates the meeting."""
    return secrets.token_hex(TOKEN_BYTES)


def bind_socket(host: str, port: int = 0) -> socket.socket:
    """A TCP socket bound to ``(host, port)`` (port 0: any free one), not yet listening."""
    family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.bind(address)
    except OSError:
        sock.close()
        raise
    return sock


def free_port(host: str = "127.0.0.1") -> int:
    """A port the OS reports free on ``host`` (bound and released)."""
    with bind_socket(host) as sock:
        return sock.getsockname()[1]


def serve(host: str, port: int, timeout_s: float) -> dist.TCPStore:
    """The master of a group's store, listening on ``host`` only (port 0: any free one; the
    store's ``port`` says which)."""
    import torch.distributed as dist

    sock = bind_socket(host, port)
    # The store owns the fd from here on (it closes it with the server): detach, so the
    # Python socket object does not close it under the store when collected.
    fd = sock.detach()
    try:
        return dist.TCPStore(
            host,
            port,
            None,
            True,
            timedelta(seconds=timeout_s),
            wait_for_workers=False,
            master_listen_fd=fd,
            use_libuv=True,
        )
    except Exception:
        socket.close(fd)
        raise


def connect(host: str, port: int, timeout_s: float) -> dist.TCPStore:
    """A client of the store at ``(host, port)``; retries until ``timeout_s`` (the master
    may not be up yet)."""
    import torch.distributed as dist

    return dist.TCPStore(host, port, None, False, timedelta(seconds=timeout_s))


def guard(store: dist.Store, token: str) -> dist.PrefixStore:
    """``store`` as the group sees it: every key under the group's token."""
    if not token:
        raise ValueError("a TCP store needs its group's token (none was published)")
    import torch.distributed as dist

    return dist.PrefixStore(f"{token}/", store)


def split_tcp(init_method: str) -> tuple[str, int]:
    """``tcp://host:port`` -> ``(host, port)`` (an IPv6 host may be bracketed)."""
    host, _, port = init_method.removeprefix("tcp://").rpartition(":")
    return host.strip("[]"), int(port)
