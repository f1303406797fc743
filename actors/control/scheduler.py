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
    PrefillHandoffs the prefill role's: requests leave at their first token, pages pinned
    HandoffIntake   the decode role's: handoffs reserve pages, wait for KV, then decode

It keeps intake, the probe and the update after the forward, and offers the simulator's fast
path its decode-only steps (``plan_decode_round`` ... ``skip_decode_rounds``).
"""

from __future__ import annotations

from collections import deque
from types import EllipsisType

from actors.control.admission import AdmissionWaits
from actors.control.decode_role import HandoffIntake
from actors.control.endings import RequestEnds
from actors.control.fork import fork_sequences
from actors.control.kv_pool import KVPool
from actors.control.page_keys import extend_keys
from actors.control.planner import PREFILL_WATERMARK, RoundPlanner
from actors.control.prefill_role import PrefillHandoffs
from actors.control.prefix_cache import PrefixCache
from actors.control.queues import RequestQueues
from actors.control.request import Request, RequestStatus
from actors.control.round import (
    PROBES,
    Probe,
    RoundPlan,
    RoundResult,
    TokenEvent,
)
from actors.server_args import ServerArgs
from gate.permission import Permission

_RETRACTED = RequestStatus.RETRACTED
_DECODING = RequestStatus.DECODING
_LOADING = RequestStatus.LOADING
_LENGTH = RequestStatus.FINISHED_LENGTH
# ``decode_horizon``'s answer for "not within any run": no request is that far from its end.
FAR_ROUNDS = 1 << 30


class Scheduler:
    """Plans one rank's rounds: readmission, decodes, and (if the gate allows) prefill.

    Composed of parts it owns and calls, over one ``RequestQueues``: the planner (what a
    round runs), the endings part (aborts, failures) and the admission-wait metric.
    """

    def __init__(self, args: ServerArgs, max_model_len: int | EllipsisType | None = ...) -> None:
        self.args = args
        self.pool = KVPool(args.num_kv_pages, args.page_size)
        self.prefix = PrefixCache(self.pool, args.enable_prefix_caching)
        self.max_batch_size = args.max_batch_size
        # The context length is ``args.max_model_len`` (resolved once against the model). The
        # simulator runs no model and passes None: then only the pool bounds a sequence.
        self.max_model_len = args.max_model_len if max_model_len is ... else max_model_len
        self.vocab_size = args.model_config.vocab_size
        # No sequence may outgrow the rank's whole pool: past that length a lone request is
        # retracted and can never be readmitted (it would wait forever), so it finishes with
        # "length" there, as it would at the context length.
        capacity = self.pool.num_pages * self.pool.page_size
        self.max_sequence_len = min(self.max_model_len or capacity, capacity)
        self.queues = queues = RequestQueues()
        # The queues under the names the engine, the simulator and the metrics read (the same
        # objects: nothing rebinds them).
        self.waiting = queues.waiting
        self.running = queues.running
        self.retracted = queues.retracted
        self.requests = queues.requests
        self.round = 0
        # Rounds each prompt waited for the gate (the admission-wait metric).
        self.waits = AdmissionWaits()
        self.ends = ends = RequestEnds(queues, self.pool, self.prefix, self.waits)
        # The disaggregated roles' parts (``actors.control.handoff``); None on a fused rank.
        role = args.disaggregation_mode
        self.handoffs = PrefillHandoffs(queues, self.pool) if role == "prefill" else None
        self.intake = None
        if role == "decode":
            self.intake = HandoffIntake(
                queues,
                self.pool,
                self.prefix,
                ends,
                self.max_batch_size,
                PREFILL_WATERMARK,
                self.max_sequence_len,
                self._retire,
            )
            ends.free_pages = self.intake.free_pages
        self.planner = RoundPlanner(
            args, queues, self.pool, self.prefix, self.waits, ends, self.intake
        )

    # ---- intake --------------------------------------------------------------------------

    def check_fits(self, request: Request) -> None:
        """Refuse a prompt that could never run on this rank: a token outside the vocabulary,
        or a prompt (plus its first token) past the context length or the whole pool.

        The rank's one limit check, made at its intake (``EngineCore.submit``, the trust
        boundary); it reads only fixed limits, so any thread may call it.
        """
        vocab = self.vocab_size
        ids = request.prompt_token_ids
        # min/max first: a C-speed pass where the scan for the culprit costs ~10 us a prompt.
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
        if request.request_id in self.requests:
            raise ValueError(f"duplicate request id {request.request_id!r}")
        request.status = RequestStatus.LOADING if loading else RequestStatus.WAITING
        request.arrival_round = self.round
        self.requests[request.request_id] = request
        self.waiting.append(request)
        self.waits.arrived(request)

    def mark_loaded(self, request_id: str) -> None:
        """A loading prompt became schedulable (ignored if it was aborted meanwhile)."""
        # The load completes on its own schedule: the client may have aborted the request (and
        # the plan removed it) before the read finished, so an unknown id is not an error.
        request = self.requests.get(request_id)
        if request is not None and request.status is RequestStatus.LOADING:
            request.status = RequestStatus.WAITING

    def abort(self, request_id: str) -> None:
        """Cancel a request; applied at the next plan (safe to call from another thread)."""
        self.ends.abort(request_id)

    # ---- the probe and what the engine reads ---------------------------------------------

    def probe(self) -> Probe:
        """What this rank publishes: prefill backlog (under the watermark rule), decode work."""
        num_partial = len(self.queues.partial)
        if self.intake is not None:  # a decode rank never wants prefill
            return PROBES[False, bool(self.running)]
        new_work = bool(self.waiting) and self.pool.occupancy <= PREFILL_WATERMARK
        return PROBES[num_partial > 0 or new_work, len(self.running) > num_partial]

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
            and len(self.running) < self.max_batch_size
            and self.pool.occupancy <= PREFILL_WATERMARK
        )

    @property
    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running or self.retracted or self.ends.pending_aborts)

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
                req = self.requests.get(request_id)
                if req is not None:
                    ends.fail(req, error)
        events = ends.take_events() if ends.events else []
        if self.prefix.enabled and plan.num_extends:
            self.prefix.keep_prefilled(plan)
        if result.prompt_logprobs:  # only requests that asked (a failed one is finished)
            for request_id, entries in result.prompt_logprobs.items():
                req = self.requests.get(request_id)
                if req is not None and not req.is_finished:
                    req.prompt_logprobs.extend(entries)
        sampled = result.sampled
        logprobs = result.logprobs
        max_len = self.max_sequence_len
        handoffs = self.handoffs
        append = events.append
        # TokenEvent(...) without its __new__: bench_control_plane, about 0.17 us per token
        # (~11 of the ~90 us rank-round at 64 running requests).
        make_event = tuple.__new__
        append_token = Request.append_token  # unbound: no bound method built per token
        for req, start, num_tokens, _ in plan.chunks:
            # RETRACTED and every finished status sort at or after RETRACTED.
            if req.status >= _RETRACTED:
                continue
            # ``chunk.samples``, inlined (only a chunk that reaches the last token samples):
            # bench_control_plane, ~0.15 us per running request a round.
            if start + num_tokens < req.num_prompt_tokens + len(req.output_token_ids):
                continue
            token = sampled[req.request_id]
            if logprobs and req.request_id in logprobs:  # only the requests that asked
                req.output_logprobs.append(logprobs[req.request_id])
            req.status = _DECODING
            finished = append_token(req, token, max_len)
            if handoffs is not None and not (finished and req.sampling.n == 1):
                # A prefill rank: the request leaves with its first token(s), never decoding
                # here; its stream's first event comes from the decode rank.
                handoffs.hand_off(req, result.forks.get(req.request_id, ()), logprobs)
                continue
            if finished:
                self._retire(req)
            append(make_event(TokenEvent, (req, token, finished)))
        if result.forks and handoffs is None:
            self._fork(plan, result, events)
        return events

    def _retire(self, req: Request) -> None:
        """A running request finished: its last full page keyed (a finished answer stays
        reusable), its pages freed, and it leaves the queues."""
        if self.prefix.enabled:
            self.prefix.keep_last_page(req)
        self.pool.free(req.request_id)
        self.queues.retire(req)

    def _fork(self, plan: RoundPlan, result: RoundResult, events: list[TokenEvent]) -> None:
        """Take in the sequences forked this round (``actors.control.fork``): as retracted
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
                    self.requests[child.request_id] = child
                    self.queues.resume_status[child.request_id] = _DECODING
                    child.status = _RETRACTED
                    self.retracted.append(child)
                events.append(TokenEvent(child, token, finished))

    # ---- decode-only rounds, without plan objects (the simulator's fast path) ---------------
    #
    # A rank whose running requests all decode, with nothing retracted, resident or ending,
    # runs rounds whose outcome is known without building a plan: one token per request and a
    # page whenever one fills. These methods make exactly the state changes ``plan`` and
    # ``update`` would, in the same order (the same page ids, keys and evictions), for one
    # such round or k of them; ``tests/test_fast_forward.py`` compares whole simulated runs.

    @property
    def is_steady(self) -> bool:
        """Whether every running request decodes and no resident chunk, retracted request,
        pending abort or final event could change the next plans (prompts may wait)."""
        return not (self.queues.partial or self.retracted or self.ends.has_pending)

    def plan_decode_round(self) -> list[tuple[Request, int]] | None:
        """``plan`` for a steady rank with nothing waiting (it can only decode, whatever the
        vote): ``(request, start)`` per running request in plan order, pages granted. None
        (and nothing changed) when the rank has other work, the token budget would cut the
        decodes short or a decode would need a retraction: then ``plan`` decides."""
        running = self.running
        ends = self.ends
        # ``is_steady`` and an empty queue, inlined: asked of every rank every full round.
        if (
            self.waiting
            or self.queues.partial
            or self.retracted
            or ends.pending_aborts
            or ends.events
            or len(running) > self.args.max_scheduled_tokens
        ):
            return None
        pool = self.pool
        page_size = pool.page_size
        new_pages = 0
        for req in running:
            need = req.num_prompt_tokens + len(req.output_token_ids)
            if need > len(req.page_ids) * page_size:
                new_pages += pool.pages_for(need) - len(req.page_ids)
        if new_pages > pool.num_free_pages:
            return None
        self.round += 1
        keep = self.prefix.enabled
        decodes = []
        for req in running:
            computed = req.num_computed_tokens
            need = req.num_prompt_tokens + len(req.output_token_ids)
            if need > len(req.page_ids) * page_size:
                if keep:
                    self.prefix.keep_last_page(req)
                pool.grow(req.request_id, need)
            decodes.append((req, computed))
            req.num_computed_tokens = computed + 1
        return decodes

    def update_decode_round(
        self, decodes: list[tuple[Request, int]], token: int
    ) -> list[TokenEvent]:
        """``update`` after ``plan_decode_round``'s decodes, each of which sampled ``token``."""
        events = []
        max_len = self.max_sequence_len
        make_event = tuple.__new__
        for req, _ in decodes:
            req.status = _DECODING
            finished = req.append_token(token, max_len)
            if finished:
                self._retire(req)
            events.append(make_event(TokenEvent, (req, token, finished)))
        return events

    def decode_horizon(self) -> tuple[int, int]:
        """For a steady rank: steady decode rounds until its first request finishes at its
        length (the finishing round counted), and until its first page grant; ``FAR_ROUNDS``
        for never."""
        room = self.max_sequence_len
        page_size = self.pool.page_size
        first_end = first_grant = FAR_ROUNDS
        for req in self.running:
            prompt = req.num_prompt_tokens
            out = len(req.output_token_ids)
            left = req.sampling.max_tokens - out
            if room - prompt - out < left:
                left = room - prompt - out
            if left < first_end:
                first_end = left
            # A round's decode needs room for computed + 1 tokens: a new page once the held
            # ones are full of computed tokens (then every page_size rounds).
            grant = len(req.page_ids) * page_size - req.num_computed_tokens
            if grant < first_grant:
                first_grant = grant
        return first_end, first_grant

    def decode_page_grants(self, k: int) -> list[tuple[int, int, Request]] | None:
        """The page grants of k steady decode rounds as ``(round, running order, request)``,
        in the order the plans make them; None when the pool cannot grant them all, or when
        they would carry it across the watermark while a prompt waits (its probe flips)."""
        pool = self.pool
        page_size = pool.page_size
        grants: list[tuple[int, int, Request]] = []
        for order, req in enumerate(self.running):
            j = len(req.page_ids) * page_size - req.num_computed_tokens
            while j < k:
                grants.append((j, order, req))
                j += page_size
        if not grants:
            return grants
        if len(grants) > pool.num_free_pages:
            return None
        if self.waiting:
            before = pool.occupancy > PREFILL_WATERMARK
            after = (pool.num_used_pages + len(grants)) / pool.num_pages > PREFILL_WATERMARK
            if before != after:
                return None
        if len(grants) > 1:
            grants.sort(key=lambda g: (g[0], g[1]))
        return grants

    def skip_decode_rounds(
        self, k: int, grants: list[tuple[int, int, Request]], token: int, horizon: int
    ) -> list[Request]:
        """Apply k steady decode rounds at once; returns the requests the last one finished,
        in running order.

        Every running request gets k tokens ``token`` (one that stops none of them), the pool
        takes ``grants`` (``decode_page_grants(k)``), the waits count k plans, and the round
        counter moves by k. ``horizon`` is ``decode_horizon()[0]``: the caller skips no
        further (k <= horizon), and only at k == horizon does the last round finish requests.
        It has also checked that no vote admits a waiting prompt in those rounds.
        """
        tokens = [token] * k
        for req in self.running:
            req.output_token_ids.extend(tokens)
            req.num_computed_tokens += k
        if grants:
            self._grant(grants, k)
        if self.waiting:
            # Each plan counts an excused round before its probe publishes a want: round 0's
            # count comes before the stamp of a held prompt's first want, the rest after. The
            # grants keep the pool on its side of the watermark, so every round agrees.
            waits = self.waits
            over = self.pool.occupancy > PREFILL_WATERMARK
            excused = over or len(self.running) >= self.max_batch_size  # ``is_excused``
            if excused:
                waits.excused_rounds += 1
            if not over:  # the probe wants prefill for the held prompt
                waits.wanted(self.round + 1)  # round 0 publishes a held prompt's first want
            if excused:
                waits.excused_rounds += k - 1
        self.round += k
        if k < horizon:
            return []
        max_len = self.max_sequence_len
        done = [
            req
            for req in self.running
            if len(req.output_token_ids) >= req.sampling.max_tokens
            or req.num_prompt_tokens + len(req.output_token_ids) >= max_len
        ]
        for req in done:
            req.status = _LENGTH
            self._retire(req)
        return done

    def _grant(self, grants: list[tuple[int, int, Request]], k: int) -> None:
        """The skipped plans' pool steps (after the k rounds' tokens are counted): key the page
        just filled (``PrefixCache.keep_last_page``), then take the next one (``KVPool.grow``)."""
        pool = self.pool
        page_size = pool.page_size
        keep = self.prefix.enabled
        for j, _, req in grants:
            tokens = req.num_computed_tokens - k + j  # computed when round j plans: a page edge
            full = tokens // page_size
            if keep and full and len(req.page_ids) >= full:
                keys = extend_keys(req.page_keys, req.token_ids, full * page_size, page_size)
                pool.register(req.page_ids[full - 1], keys[full - 1])
            pool.grow(req.request_id, tokens + 1)
