"""One rank's scheduler: the gate's probe, the round plan, and bookkeeping after the forward.

    add_request ─► waiting ──(gate open, slot free, pool <= watermark)──► running
                                                                          │  ▲
                                   KV pressure: newest running retracted ▼  │ readmit
                                                                       retracted

``plan`` advances ``num_computed_tokens`` for what it schedules, so the probe taken right after
the plan already sees this round's chunks as done: it reports only prefill work that is still
left for later rounds.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from actors.kv_pool import KVPool
from actors.request import Request, RequestStatus
from actors.round import RoundPlan, RoundResult, ScheduledChunk
from actors.server_args import ServerArgs

PREFILL_WATERMARK = 0.9


@dataclass(frozen=True, slots=True)
class Probe:
    """The two booleans a rank publishes to the gate each round."""

    wants_prefill: bool
    has_decode_work: bool


@dataclass(frozen=True, slots=True)
class TokenEvent:
    """A token appended to a request (``token_id`` None for a finish without a token)."""

    request: Request
    token_id: int | None
    finished: bool


class Scheduler:
    """Plans one rank's rounds: readmission, decodes, and (if the gate allows) prefill."""

    def __init__(self, args: ServerArgs, max_model_len: int | None = None) -> None:
        self.args = args
        self.pool = KVPool(args.num_kv_pages, args.page_size)
        self.max_batch_size = args.max_batch_size
        self.max_model_len = max_model_len or args.max_model_len
        # No sequence may outgrow the rank's whole pool: past that length a lone request is
        # retracted and can never be readmitted (it would wait forever), so it finishes with
        # "length" there, as it would at the context length.
        capacity = self.pool.num_pages * self.pool.page_size
        self.max_sequence_len = min(self.max_model_len or capacity, capacity)
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.retracted: deque[Request] = deque()
        self.requests: dict[str, Request] = {}
        self.round = 0
        self.num_retractions = 0
        self.num_aborts = 0
        # Rounds in which a new prompt was held by pressure or a full batch, not by the gate.
        self.excused_rounds = 0
        self._pending_aborts: deque[str] = deque()
        # Prompts not yet covered by a published want, and the excused count at their want.
        self._unstamped: list[Request] = []
        self._excused_at_want: dict[str, int] = {}
        self._aborted_events: list[TokenEvent] = []
        # Status each retracted request resumes with.
        self._resume_status: dict[str, RequestStatus] = {}

    # ---- intake --------------------------------------------------------------------------

    def add_request(self, request: Request, loading: bool = False) -> None:
        """Queue a new prompt; refuses prompts that could never run on this rank."""
        if request.request_id in self.requests:
            raise ValueError(f"duplicate request id {request.request_id!r}")
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
        request.status = RequestStatus.LOADING if loading else RequestStatus.WAITING
        request.arrival_round = self.round
        self.requests[request.request_id] = request
        self.waiting.append(request)
        self._unstamped.append(request)

    def mark_loaded(self, request_id: str) -> None:
        """A loading prompt became schedulable (ignored if it was aborted meanwhile)."""
        # The load completes on its own schedule: the client may have aborted the request (and
        # the plan removed it) before the read finished, so an unknown id is not an error.
        request = self.requests.get(request_id)
        if request is not None and request.status is RequestStatus.LOADING:
            request.status = RequestStatus.WAITING

    def abort(self, request_id: str) -> None:
        """Cancel a request; applied at the next plan (safe to call from another thread)."""
        self._pending_aborts.append(request_id)

    # ---- the probe -----------------------------------------------------------------------

    def probe(self) -> Probe:
        """What this rank publishes: prefill backlog (under the watermark rule), decode work."""
        resident_chunk = False
        decode_work = False
        for req in self.running:
            if req.num_computed_tokens < req.num_prompt_tokens:
                resident_chunk = True
            else:
                decode_work = True
        new_work = bool(self.waiting) and self.pool.occupancy <= PREFILL_WATERMARK
        return Probe(resident_chunk or new_work, decode_work)

    def publish_probe(self) -> Probe:
        """The probe taken once per round after the plan, the one the gather carries.

        Also stamps waiting prompts with the round of their first published want, the start
        of their admission wait.
        """
        probe = self.probe()
        if probe.wants_prefill and self._unstamped:
            for req in self._unstamped:
                if req.first_want_round is None and req.first_prefill_round is None:
                    req.first_want_round = self.round
                    self._excused_at_want[req.request_id] = self.excused_rounds
            self._unstamped.clear()
        return probe

    def admission_wait(self, req: Request) -> int | None:
        """Rounds from first published want to first prefill, less pressure/full-batch rounds."""
        if req.first_want_round is None or req.first_prefill_round is None:
            return None
        return req.first_prefill_round - req.first_want_round - req.excused_wait_rounds

    @property
    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running or self.retracted or self._pending_aborts)

    # ---- the plan ------------------------------------------------------------------------

    def plan(self, allow_prefill: bool) -> RoundPlan:
        """Choose this round's work. ``allow_prefill=False`` holds every prefill chunk."""
        self.round += 1
        self._apply_aborts()
        plan = RoundPlan(allow_prefill=allow_prefill)
        self._readmit(plan)
        budget = self.args.max_scheduled_tokens
        if self.args.enable_mixed_prefill_decode:
            # Decodes first; while prefill may run, hold back room for it in the budget.
            reserve = min(self._pending_prefill_tokens(), budget // 2) if allow_prefill else 0
            budget -= self._plan_decodes(plan, budget - reserve)
            if allow_prefill:
                self._plan_prefill(plan, budget)
        else:
            # Non-mixed: a round with prefill runs it alone; decodes run when there is none.
            if allow_prefill:
                self._plan_prefill(plan, budget)
            if not plan.chunks:
                self._plan_decodes(plan, budget)
        self._account_excused_wait()
        return plan

    def _apply_aborts(self) -> None:
        while self._pending_aborts:
            req = self.requests.get(self._pending_aborts.popleft())
            if req is None or req.is_finished:
                continue
            for queue in (self.waiting, self.running, self.retracted):
                if req in queue:
                    queue.remove(req)
            self.pool.free(req.request_id)
            self._resume_status.pop(req.request_id, None)
            self._excused_at_want.pop(req.request_id, None)
            if req in self._unstamped:
                self._unstamped.remove(req)
            req.status = RequestStatus.FINISHED_ABORTED
            self.num_aborts += 1
            self._finish(req)
            self._aborted_events.append(TokenEvent(req, None, True))

    def _readmit(self, plan: RoundPlan) -> None:
        """Bring retracted requests back (a cache restore: no prefill tokens, gate or not)."""
        while self.retracted and len(self.running) < self.max_batch_size:
            req = self.retracted[0]
            # Room for its cached tokens plus the next one it will write.
            if self.pool.allocate(req.request_id, req.num_computed_tokens + 1) is None:
                break
            self.retracted.popleft()
            req.page_ids = self.pool.pages_of(req.request_id)
            req.status = self._resume_status.pop(req.request_id)
            self.running.append(req)
            plan.readmitted.append(req)

    def _plan_decodes(self, plan: RoundPlan, budget: int) -> int:
        """Schedule one token per decoding request; retract the newest under KV pressure."""
        used = 0
        i = 0
        while i < len(self.running) and used < budget:
            req = self.running[i]
            if req.num_computed_tokens < req.num_prompt_tokens:
                i += 1
                continue
            while not self.pool.can_fit(req.request_id, req.num_tokens):
                victim = self.running[-1]
                self._retract(victim, plan)
                if victim is req:
                    break
            if req.status is RequestStatus.RETRACTED:
                break
            self.pool.extend(req.request_id, req.num_tokens)
            plan.chunks.append(ScheduledChunk(req, req.num_computed_tokens, 1, False))
            req.num_computed_tokens += 1
            used += 1
            i += 1
        return used

    def _plan_prefill(self, plan: RoundPlan, budget: int) -> None:
        """Resident chunks first, then new prompts, within the token budget and the pool."""
        for req in self.running:
            if budget <= 0:
                return
            if req.num_computed_tokens < req.num_prompt_tokens:
                budget -= self._schedule_chunk(plan, req, budget, may_retract=True)
        while budget > 0 and self.waiting and len(self.running) < self.max_batch_size:
            if self.pool.occupancy > PREFILL_WATERMARK:
                return
            req = self.waiting[0]
            if req.status is RequestStatus.LOADING:
                return
            if self.pool.allocate(req.request_id, 0) is None:
                return
            self.waiting.popleft()
            req.page_ids = self.pool.pages_of(req.request_id)
            req.status = RequestStatus.PREFILLING
            self.running.append(req)
            scheduled = self._schedule_chunk(plan, req, budget, may_retract=False)
            if scheduled == 0:
                # Admitted but no page to start on: back to the head of the queue.
                self.running.pop()
                self.pool.free(req.request_id)
                req.page_ids = []
                req.status = RequestStatus.WAITING
                self.waiting.appendleft(req)
                return
            budget -= scheduled

    def _schedule_chunk(self, plan: RoundPlan, req: Request, budget: int, may_retract: bool) -> int:
        """Grant pages for the next chunk of ``req`` (as many tokens as fit) and plan it."""
        start = req.num_computed_tokens
        want = min(req.num_prompt_tokens - start, budget)
        fits = self._fitting_tokens(req, start, want)
        # An eligible resident chunk with no room at all may retract the newest other request,
        # so a half-prefilled prompt cannot deadlock against decodes holding the pool.
        while fits == 0 and may_retract and self.running[-1] is not req:
            self._retract(self.running[-1], plan)
            fits = self._fitting_tokens(req, start, want)
        if fits == 0:
            return 0
        self.pool.extend(req.request_id, start + fits)
        plan.chunks.append(ScheduledChunk(req, start, fits, True))
        req.num_computed_tokens += fits
        if req.first_prefill_round is None:
            req.first_prefill_round = self.round
            at_want = self._excused_at_want.pop(req.request_id, None)
            if at_want is not None:
                req.excused_wait_rounds = self.excused_rounds - at_want
        return fits

    def _fitting_tokens(self, req: Request, start: int, want: int) -> int:
        held = len(self.pool.pages_of(req.request_id)) * self.pool.page_size
        room = held + self.pool.num_free_pages * self.pool.page_size - start
        return max(0, min(want, room))

    def _retract(self, req: Request, plan: RoundPlan) -> None:
        old_pages = list(self.pool.pages_of(req.request_id))
        self.pool.free(req.request_id)
        self.running.remove(req)
        self._resume_status[req.request_id] = req.status
        req.status = RequestStatus.RETRACTED
        req.page_ids = []
        self.retracted.append(req)
        plan.retracted.append((req, old_pages))
        # A chunk of it already planned this round would now write into freed pages.
        kept = [c for c in plan.chunks if c.request is not req]
        for chunk in plan.chunks:
            if chunk.request is req:
                req.num_computed_tokens -= chunk.num_tokens
        plan.chunks[:] = kept
        self.num_retractions += 1

    def _pending_prefill_tokens(self) -> int:
        resident = sum(r.num_uncomputed_prompt_tokens for r in self.running)
        return resident or (self.waiting[0].num_prompt_tokens if self.waiting else 0)

    def _account_excused_wait(self) -> None:
        if self.waiting and (
            self.pool.occupancy > PREFILL_WATERMARK or len(self.running) >= self.max_batch_size
        ):
            self.excused_rounds += 1

    # ---- after the forward ---------------------------------------------------------------

    def update(self, plan: RoundPlan, result: RoundResult) -> list[TokenEvent]:
        """Append sampled tokens, finish requests and free their pages."""
        events, self._aborted_events = self._aborted_events, []
        for chunk in plan.chunks:
            req = chunk.request
            if req.is_finished or req.status is RequestStatus.RETRACTED:
                continue
            if not chunk.samples:
                continue
            token = result.sampled[req.request_id]
            req.status = RequestStatus.DECODING
            req.append_token(token, self.max_sequence_len)
            if req.is_finished:
                self.running.remove(req)
                self.pool.free(req.request_id)
                self._finish(req)
            events.append(TokenEvent(req, token, req.is_finished))
        return events

    def _finish(self, req: Request) -> None:
        req.page_ids = []
        self.requests.pop(req.request_id, None)
