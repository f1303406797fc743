"""One rank's scheduler: the gate's probe, the round plan, and bookkeeping after the forward.

    add_request ─► waiting ──(gate open, slot free, pool <= watermark)──► running
                                                                          │  ▲
                                   KV pressure: newest running retracted ▼  │ readmit
                                                                       retracted

``plan`` advances ``num_computed_tokens`` for what it schedules, so the probe taken right after
the plan already sees this round's chunks as done: it reports only prefill work that is still
left for later rounds.

The scheduler is composed of parts it owns, each given what it works on when it is built:

    RequestQueues   where each request is (waiting, running, retracted), shared by the parts
    RoundPlanner    what a round runs: readmissions, decodes, prefill chunks, retractions
    RequestEnds     aborts and per-request failures, and their final events
    AdmissionWaits  the admission-wait metric (rounds a prompt waited for the gate)
    KVConnector     where KV crosses ranks, by the rank's role (``kv_connector.py``): none
                    (fused), PrefillHandoffs (requests leave at their first token, pages
                    pinned) or HandoffIntake (handoffs reserve pages, wait for KV, then decode)
    SteadyDecodes   a steady rank's decode rounds k at once, for a driver that knows the
                    token every decode samples (the simulator's fast path)

It keeps intake, the probe, the plan and the update after the forward, and the rounds' own
bookkeeping (the round counter, the admission waits) whichever way the rounds are run.
"""

from __future__ import annotations

from collections import deque

from roundgate.actors.control.admission import AdmissionWaits
from roundgate.actors.control.config import SchedulerConfig
from roundgate.actors.control.decode_role import HandoffIntake
from roundgate.actors.control.endings import RequestEnds
from roundgate.actors.control.fork import fork_sequences
from roundgate.actors.control.kv_connector import KVConnector, NoKVConnector
from roundgate.actors.control.kv_pool import KVPool
from roundgate.actors.control.planner import PREFILL_WATERMARK, RoundPlanner
from roundgate.actors.control.prefill_role import PrefillHandoffs
from roundgate.actors.control.prefix_cache import PrefixCache
from roundgate.actors.control.queues import RequestQueues
from roundgate.actors.control.request import Request, RequestStatus
from roundgate.actors.control.round import (
    PROBES,
    Probe,
    RoundPlan,
    RoundResult,
    TokenEvent,
)
from roundgate.actors.control.steady_decodes import Grant, SteadyDecodes
from roundgate.actors.role import DisaggregationRole
from roundgate.actors.server_args import ServerArgs
from roundgate.gate.permission import Permission

_RETRACTED = RequestStatus.RETRACTED
_DECODING = RequestStatus.DECODING


class Scheduler:
    """Plans one rank's rounds: readmission, decodes, and (if the gate allows) prefill.

    Composed of parts it owns and calls, over one ``RequestQueues``: the planner (what a
    round runs), the endings part (aborts, failures) and the admission-wait metric.
    """

    def __init__(self, config: SchedulerConfig | ServerArgs) -> None:
        if not isinstance(config, SchedulerConfig):
            config = SchedulerConfig.from_args(config)
        self.config = config
        self.pool = KVPool(config.pool)
        self.prefix = PrefixCache(self.pool, config.enable_prefix_caching)
        self.max_batch_size = config.max_batch_size
        # The context length (resolved once against the model). The simulator runs no model
        # and sets None: then only the pool bounds a sequence.
        self.max_model_len = config.max_model_len
        self.vocab_size = config.vocab_size
        # No sequence may outgrow the rank's whole pool: past that length a lone request is
        # retracted and can never be readmitted (it would wait forever), so it finishes with
        # "length" there, as it would at the context length.
        capacity = self.pool.num_pages * self.pool.page_size
        self.max_sequence_len = min(self.max_model_len or capacity, capacity)
        # Where each request is: the one set of queues the parts share, read by the engine,
        # the simulator and the metrics as ``scheduler.queues.waiting`` and so on.
        self.queues = queues = RequestQueues()
        self.round = 0
        self.num_received = 0  # requests ever queued here (the routers match their sends to it)
        # Rounds each prompt waited for the gate (the admission-wait metric).
        self.waits = AdmissionWaits()
        # An ended request's pages go back through the rank's KV connector (built below, as
        # a decode rank's needs this part; called only once both exist).
        self.ends = ends = RequestEnds(
            queues,
            self.pool,
            self.prefix,
            self.waits,
            free_pages=lambda req: self.connector.free_pages(req),
        )
        # The rank's P/D role, and the part its KV crosses ranks through: out (prefill),
        # in (decode) or not at all (fused).
        self.role = role = config.disaggregation_mode
        self.connector: KVConnector
        if role is DisaggregationRole.PREFILL:
            self.connector = PrefillHandoffs(queues, self.pool)
        elif role is DisaggregationRole.DECODE:
            self.connector = HandoffIntake(
                queues,
                self.pool,
                self.prefix,
                ends,
                self.max_batch_size,
                PREFILL_WATERMARK,
                self.max_sequence_len,
                self.retire,
            )
        else:
            self.connector = NoKVConnector(self.pool)
        self.planner = RoundPlanner(
            config, queues, self.pool, self.prefix, self.waits, ends, self.connector
        )
        # A steady rank's decode rounds, k at once: its queries (``horizon``, ``page_grants``)
        # read the rank, and ``skip_decode_rounds`` applies them with the rounds' bookkeeping.
        self.steady = SteadyDecodes(queues, self.pool, self.prefix, self.max_sequence_len)

    # ---- intake --------------------------------------------------------------------------

    def check_fits(self, request: Request) -> None:
        """Refuse a prompt that could never run on this rank: a token outside the vocabulary,
        or a prompt (plus its first token) past the context length or the whole pool.

        The rank's one limit check, made at its intake (``EngineCore.submit``, the trust
        boundary); it reads only fixed limits, so any thread may call it.
        """
        vocab = self.vocab_size
        ids = request.prompt_token_ids
        # min/max first: a C-speed pass; the Python scan for the culprit runs only on a refusal.
        if not 0 <= min(ids) <= max(ids) < vocab:
            bad = next(t for t in ids if not 0 <= t < vocab)
            raise ValueError(f"prompt token id {bad} is outside the vocabulary [0, {vocab})")
        request.sampling.check_vocab(vocab)
        need = request.num_prompt_tokens + 1
        if self.max_model_len is not None and need > self.max_model_len:
            raise ValueError(
                f"prompt of {request.num_prompt_tokens} tokens does not fit the context "
                f"length {self.max_model_len}"
            )
        if self.pool.pages_for(need) > self.pool.num_pages:
            raise ValueError(
                f"prompt of {request.num_prompt_tokens} tokens needs more KV pages than the "
                f"rank has ({self.pool.num_pages} x {self.pool.page_size} tokens)"
            )

    def add_request(self, request: Request, loading: bool = False) -> None:
        """Queue a new prompt (refusing a duplicate id). Its limits were checked once, at the
        rank's intake (``check_fits``); the simulator checks its workload up front."""
        queues = self.queues
        if request.request_id in queues.requests:
            raise ValueError(f"duplicate request id {request.request_id!r}")
        request.status = RequestStatus.LOADING if loading else RequestStatus.WAITING
        request.arrival_round = self.round
        self.num_received += 1
        queues.requests[request.request_id] = request
        queues.waiting.append(request)
        self.waits.arrived(request)

    def mark_loaded(self, request_id: str) -> None:
        """A loading prompt became schedulable (ignored if it was aborted meanwhile)."""
        # The load completes on its own schedule: the client may have aborted the request (and
        # the plan removed it) before the read finished, so an unknown id is not an error.
        request = self.queues.requests.get(request_id)
        if request is not None and request.status is RequestStatus.LOADING:
            request.status = RequestStatus.WAITING

    def abort(self, request_id: str) -> None:
        """Cancel a request; applied at the next plan (safe to call from another thread)."""
        self.ends.abort(request_id)

    # ---- the probe and what the engine reads ---------------------------------------------

    def probe(self) -> Probe:
        """What this rank publishes: prefill backlog (under the watermark rule), decode work."""
        queues = self.queues
        num_partial = len(queues.partial)
        if self.role is DisaggregationRole.DECODE:  # a decode rank never wants prefill
            return PROBES[False, bool(queues.running)]
        new_work = bool(queues.waiting) and self.pool.occupancy <= PREFILL_WATERMARK
        return PROBES[num_partial > 0 or new_work, len(queues.running) > num_partial]

    def publish_probe(self) -> Probe:
        """The probe taken once per round after the plan, the one the gather carries.

        Also stamps waiting prompts with the round of their first published want, the start
        of their admission wait.
        """
        probe = self.probe()
        if probe.wants_prefill:
            self.waits.wanted(self.round)
        return probe

    def admission_wait(self, req: Request) -> int | None:
        """Rounds from first published want to first prefill, less pressure/full-batch rounds."""
        return self.waits.of(req)

    @property
    def excused_rounds(self) -> int:
        """Rounds in which a new prompt was held by pressure or a full batch, not by the gate."""
        return self.waits.excused_rounds

    @property
    def num_resident_chunks(self) -> int:
        """Running requests whose prompt is not fully computed yet."""
        return len(self.queues.partial)

    @property
    def can_admit(self) -> bool:
        """Whether the next plan could admit the queue head: schedulable, a free slot, and
        the pool at or under the watermark (SGLang's "reached admission" check)."""
        return (
            self.queues.first_schedulable() is not None
            and len(self.queues.running) < self.max_batch_size
            and self.pool.occupancy <= PREFILL_WATERMARK
        )

    @property
    def has_unfinished(self) -> bool:
        q = self.queues
        return bool(q.waiting or q.running or q.retracted or self.ends.pending_aborts)

    @property
    def prefill_sizes(self) -> deque[int]:
        """New-prompt and chunk counts of recent prefill rounds (SGLang's max_prefill_bs)."""
        return self.planner.prefill_sizes

    @property
    def num_retractions(self) -> int:
        return self.planner.num_retractions

    @property
    def num_aborts(self) -> int:
        return self.ends.num_aborts

    @property
    def num_failures(self) -> int:
        """Requests failed alone (their planning or their forward raised)."""
        return self.ends.num_failures

    @property
    def aborted_parked_ids(self) -> list[str]:
        """Retracted requests ended before readmission; the engine core drains this list."""
        return self.ends.aborted_parked_ids

    # ---- the round -----------------------------------------------------------------------

    def plan(self, permission: Permission) -> RoundPlan:
        """Choose this round's work under the policy's permission (new prompts, resident
        chunks, both or neither: ``vote.permission``)."""
        self.round += 1
        if self.ends.pending_aborts:
            self.ends.apply_aborts()
        return self.planner.plan(permission, self.round)

    def update(self, plan: RoundPlan, result: RoundResult) -> list[TokenEvent]:
        """Append sampled tokens, finish requests and free their pages."""
        ends = self.ends
        if not plan.chunks and not ends.events:
            return []
        if result.failed:
            for request_id, error in result.failed.items():
                req = self.queues.requests.get(request_id)
                if req is not None:
                    ends.fail(req, error)
        events = ends.take_events() if ends.events else []
        if self.prefix.enabled and plan.num_extends:
            self.prefix.keep_prefilled(plan)
        if result.prompt_logprobs:  # only requests that asked (a failed one is finished)
            for request_id, entries in result.prompt_logprobs.items():
                req = self.queues.requests.get(request_id)
                if req is not None and not req.is_finished:
                    req.prompt_logprobs.extend(entries)
        sampled = result.sampled
        logprobs = result.logprobs
        max_len = self.max_sequence_len
        # A prefill rank's requests leave through its connector at their first token.
        hands_off = self.role is DisaggregationRole.PREFILL
        connector = self.connector
        append = events.append
        # TokenEvent(...) without its __new__: one is built per token per round, a visible
        # share of the rank-round (benchmarks/bench_control_plane.py).
        make_event = tuple.__new__
        append_token = Request.append_token  # unbound: no bound method built per token
        for req, start, num_tokens, is_prefill in plan.chunks:
            # RETRACTED and every finished status sort at or after RETRACTED.
            if req.status >= _RETRACTED:
                continue
            # ``chunk.samples``, inlined (only a chunk that reaches the last token samples):
            # asked of every running request every round.
            if start + num_tokens < req.num_prompt_tokens + len(req.output_token_ids):
                continue
            if req.drafts and self._apply_verified(req, start, result, events, max_len):
                continue  # it finished on a kept draft
            token = sampled[req.request_id]
            if logprobs and req.request_id in logprobs:  # only the requests that asked
                req.output_logprobs.append(logprobs[req.request_id])
            req.status = _DECODING
            finished = append_token(req, token, max_len)
            if hands_off and not (finished and req.sampling.n == 1):
                # A prefill rank: the request leaves with its first token(s), never decoding
                # here; its stream's first event comes from the decode rank.
                connector.hand_off(req, result.forks.get(req.request_id, ()), logprobs)
                continue
            if finished:
                self.retire(req)
            elif num_tokens > 1 and not is_prefill:  # a verification: pages made exact
                self._after_verify(req, start)
            append(make_event(TokenEvent, (req, token, finished)))
        if result.forks and not hands_off:
            self._fork(plan, result, events)
        if result.drafts:  # a draft model's proposals for the next round
            requests = self.queues.requests
            for request_id, drafts in result.drafts.items():
                req = requests.get(request_id)
                if req is not None and req.status < _RETRACTED:
                    req.proposed_drafts = drafts
        return events

    # ---- steady decode rounds, k at once (the simulator's fast path) ---------------------

    @property
    def is_steady(self) -> bool:
        """Whether every running request decodes and no resident chunk, retracted request,
        pending abort or final event could change the next plans (prompts may wait)."""
        queues = self.queues
        return not (queues.partial or queues.retracted or self.ends.has_pending)

    def skip_decode_rounds(
        self, k: int, grants: list[Grant], token: int, horizon: int
    ) -> list[Request]:
        """Apply k steady decode rounds at once, as k held plans, probes and updates would;
        returns the requests the last round finished, in running order.

        Every decode samples ``token`` (one that stops none of them); ``grants`` are
        ``steady.page_grants(k)`` and ``horizon`` is ``steady.horizon()[0]``: the caller skips
        no further (k <= horizon), and checked that no vote admits a held prompt meanwhile.
        """
        finishing = k == horizon
        self.steady.decode(k, grants, token, finishing)
        if self.queues.waiting:
            # Round 0's plan counts an excused round before its published probe stamps a held
            # prompt's first want, the later plans after it. The grants keep the pool on its
            # side of the watermark, so every round's probe and excuse agree.
            excused = self.planner.is_excused
            self.round += 1
            if excused:
                self.waits.excuse()
            if self.waits.has_unstamped:  # else the probe would stamp nothing
                self.publish_probe()
            self.round += k - 1
            if excused:
                self.waits.excuse(k - 1)
        else:
            self.round += k
        if not finishing:
            return []
        # The last round's token, appended as ``update`` appends it.
        max_len = self.max_sequence_len
        append_token = Request.append_token
        finished = [req for req in self.queues.running if append_token(req, token, max_len)]
        for req in finished:
            self.retire(req)
        return finished

    def _apply_verified(
        self,
        req: Request,
        start: int,
        result: RoundResult,
        events: list[TokenEvent],
        max_len: int | None,
    ) -> bool:
        """Append the drafts verification kept (each computed: its K/V was written at its
        position), before the round's own token; True when one of them finished ``req``."""
        drafts, req.drafts = req.drafts, ()
        rid = req.request_id
        kept = result.accepted.get(rid, ())
        self.planner.speculator.verified(req, len(drafts), len(kept))
        kept_logprobs = result.accepted_logprobs.get(rid)
        for i, token in enumerate(kept):
            if kept_logprobs is not None:
                req.output_logprobs.append(kept_logprobs[i])
            req.num_computed_tokens += 1
            finished = req.append_token(token, max_len)
            events.append(TokenEvent(req, token, finished))
            if finished:
                self.retire(req)
                return True
        return False

    def _after_verify(self, req: Request, start: int) -> None:
        """A verification's pages made exact: those of rejected drafts given back, the
        pages its kept drafts filled keyed (prefix caching)."""
        self.pool.truncate(req.request_id, req.num_tokens)
        if self.prefix.enabled:
            self.prefix.keep_decoded_pages(req, start)

    def retire(self, req: Request) -> None:
        """A running request finished: its last full page keyed (a finished answer stays
        reusable), its pages freed, and it leaves the queues."""
        if self.prefix.enabled:
            self.prefix.keep_last_page(req)
        self.pool.free(req.request_id)
        self.queues.retire(req)

    def _fork(self, plan: RoundPlan, result: RoundResult, events: list[TokenEvent]) -> None:
        """Take in the sequences forked this round (``roundgate.actors.control.fork``): as retracted
        requests whose KV the executor saved, so readmission gives each its own pages."""
        parents = {c.request.request_id: c.request for c in plan.chunks}
        for request_id, firsts in result.forks.items():
            forked = fork_sequences(
                parents[request_id], firsts, result.logprobs, self.max_sequence_len
            )
            for child, token, finished in forked:
                if finished:
                    self.ends.aborted_parked_ids.append(child.request_id)  # its KV copy is unused
                else:
                    self.queues.requests[child.request_id] = child
                    self.queues.resume_status[child.request_id] = _DECODING
                    child.status = _RETRACTED
                    self.queues.retracted.append(child)
                events.append(TokenEvent(child, token, finished))
