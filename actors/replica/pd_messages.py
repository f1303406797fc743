"""The messages of the served P/D path, between the ingress and the two roles' ranks.

    ingress ── GenerateRequest ──► prefill rank .prefill()  ──► PrefillResult (a Handoff, or
                                                                the whole answer)
    ingress ── DecodeRequest ────► decode rank .decode()    ──► TransferReport, then the
                                                                GenerateChunks
    decode rank ── SendKV ───────► prefill rank .send_kv()  (the pages go over the KV link)
    ingress ── ReleaseHandoff ───► prefill rank             (a handoff no decode rank took)

Every message names the rank it must reach with ``dp_rank`` (the routers pin on it) or leaves
it None for the role's router: the prefill role's routes a prompt to the rank with the fewest
uncached tokens, the decode role's to the least-loaded rank (``roundgate.deployment.pd_config``:
which index and which load each reads).
"""

from __future__ import annotations

from dataclasses import dataclass

from roundgate.actors.control.handoff import Handoff
from roundgate.actors.control.messages import GenerateChunk


@dataclass(frozen=True, slots=True, kw_only=True)
class LinkSpec:
    """The P/D link of one deployment: its id (fresh per ``build_app``, so a redeployed app
    never meets the old one's ranks) and each role's number of ranks."""

    link_id: str
    num_prefill: int
    num_decode: int


@dataclass(frozen=True, slots=True, kw_only=True)
class PrefillResult:
    """What a prefill rank returns: the request's ``Handoff`` (its first tokens sampled, its
    pages pinned there) or, when it ended at its first token or was refused, ``chunks``."""

    handoff: Handoff | None
    chunks: tuple[GenerateChunk, ...] = ()
    prefill_s: float = 0.0  # arrival at the prefill rank to the handoff
    # The prefill process holding the handoff's pages (``pd_pairs``: its incarnation).
    source_incarnation: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class DecodeRequest:
    """A handoff for a decode rank (``dp_rank`` None: the decode role's router chooses)."""

    handoff: Handoff
    dp_rank: int | None = None
    source_incarnation: str = ""  # the prefill process holding the pages

    @property
    def prompt_token_ids(self) -> tuple[int, ...]:
        """The handoff's prompt: what the decode router weighs (``pick_by_prompt`` reads it)."""
        return self.handoff.prompt_token_ids


@dataclass(frozen=True, slots=True, kw_only=True)
class TransferReport:
    """A decode rank's first stream item: how the request's KV got there."""

    decode_wait_s: float  # handoff taken to pages reserved (waiting for decode capacity)
    transfer_s: float  # pages reserved to KV written (or the failure known)
    num_pages: int  # pages moved (the decode rank's prefix-cached ones stay)
    num_bytes: int
    error: str | None = None
    # The prefill process that held the pages is gone (its rank restarted): the request is
    # prefilled again elsewhere, as after any lost rank, instead of failing.
    source_lost: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class SendKV:
    """Ask prefill rank ``dp_rank`` (process ``source_incarnation``) to send a handoff's
    pages to decode rank ``dst_rank`` (process ``dst_incarnation``) over their pair, with
    ``tag``; it unpins them once sent (or once it reported that it cannot)."""

    request_id: str
    page_ids: tuple[int, ...]
    dst_rank: int
    dst_incarnation: str
    tag: int
    dp_rank: int
    source_incarnation: str


@dataclass(frozen=True, slots=True, kw_only=True)
class ReleaseHandoff:
    """Unpin a handoff no decode rank took (its client left, or the decode rank refused it)."""

    request_id: str
    dp_rank: int
