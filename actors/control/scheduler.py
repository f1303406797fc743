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
from types import EllipsisType

from actors.control.admission import AdmissionWaits
from actors.control.endings import RequestEnds
from actors.control.fork import fork_sequences
from actors.control.kv_pool import KVPool
from actors.control.planner import PREFILL_WATERMARK, RoundPlanner
from actors.control.prefix_cache import PrefixCache
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

# Prefill batch sizes remembered for SGLang's ``max_prefill_bs`` column (its window length).
PREFILL_SIZE_WINDOW = 16
_RETRACTED = RequestStatus.RETRACTED
_DECODING = RequestStatus.DECODING
_LOADING = RequestStatus.LOADING


class Scheduler(RoundPlanner, RequestEnds):
    """Plans one rank's rounds: readmission, decodes, and (if the gate allows) prefill."""

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
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        # The running requests whose prompt is not fully computed (resident prefill chunks).
        # Kept in step with ``running`` so the probe is O(1) instead of a scan per round.
        self._partial: set[Request] = set()
        # New-prompt and chunk counts of recent prefill rounds (SGLang's max_prefill_bs).
        self.prefill_sizes: deque[int] = deque(maxlen=PREFILL_SIZE_WINDOW)
        self.retracted: deque[Request] = deque()
        self.requests: dict[str, Request] = {}
        self.round = 0
        self.num_retractions = 0
        self.num_aborts = 0
        self.num_failures = 0  # requests failed alone (``fail``)
        # Rounds each prompt waited for the gate (the admission-wait metric).
        self.waits = AdmissionWaits()
        self._pending_aborts: deque[str] = deque()
        # Retracted requests aborted before readmission; the engine drains this list.
        self.aborted_parked_ids: list[str] = []
        self._aborted_events: list[TokenEvent] = []
        # Status each retracted request resumes with.
        self._resume_status: dict[str, RequestStatus] = {}

    # ---- intake --------------------------------------------------------------------------

    def check_fits(self, request: Request) -> None:
        """Refuse a prompt that could never run on this rank (reads only fixed limits, so any
        thread may call it)."""
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
        """Queue a new prompt; refuses duplicates and prompts that could never run here."""
        if request.request_id in self.requests:
            raise ValueError(f"duplicate request id {request.request_id!r}")
        self.check_fits(request)
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
        self._pending_aborts.append(request_id)

    # ---- the probe -----------------------------------------------------------------------

    def probe(self) -> Probe:
        """What this rank publishes: prefill backlog (under the watermark rule), decode work."""
        num_partial = len(self._partial)
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
        return len(self._partial)

    @property
    def can_admit(self) -> bool:
        """Whether the next plan could admit the queue head: schedulable, a free slot, and
        the pool at or under the watermark (SGLang's "reached admission" check)."""
        return (
            bool(self.waiting)
            and self.waiting[0].status is not _LOADING
            and len(self.running) < self.max_batch_size
            and self.pool.occupancy <= PREFILL_WATERMARK
        )

    @property
    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running or self.retracted or self._pending_aborts)

    # ---- the plan ------------------------------------------------------------------------

    def plan(self, permission: Permission) -> RoundPlan:
        """Choose this round's work under the policy's permission (new prompts, resident
        chunks, both or neither: ``vote.permission``)."""
        allow = permission.allow_new or permission.allow_chunks
        self.round += 1
        if self._pending_aborts:
            self._apply_aborts()
        plan = RoundPlan(permission=permission)
        if self.retracted:
            self._readmit(plan)
        if not self.running and not self.waiting:
            return plan  # nothing to plan: the common case of an idle rank in a busy group
        budget = self.args.max_scheduled_tokens
        if self.args.enable_mixed_prefill_decode:
            # Decodes first; while prefill may run, hold back room for it in the budget.
            reserve = min(self._pending_prefill_tokens(permission), budget // 2) if allow else 0
            budget -= self._plan_decodes(plan, budget - reserve)
            if allow:
                self._plan_prefill(plan, budget, permission)
        else:
            # Non-mixed: a round with prefill runs it alone; decodes run when there is none.
            if allow:
                self._plan_prefill(plan, budget, permission)
            if not plan.chunks:
                self._plan_decodes(plan, budget)
        if allow and plan.num_extends:
            self.prefill_sizes.append(plan.num_extends)
        if self.waiting:
            self._account_excused_wait()
        return plan

    def _account_excused_wait(self) -> None:
        if self.waiting and (
            self.pool.occupancy > PREFILL_WATERMARK or len(self.running) >= self.max_batch_size
        ):
            self.waits.excused_rounds += 1

    # ---- after the forward ---------------------------------------------------------------

    def update(self, plan: RoundPlan, result: RoundResult) -> list[TokenEvent]:
        """Append sampled tokens, finish requests and free their pages."""
        if not plan.chunks and not self._aborted_events:
            return []
        if result.failed:
            for request_id, error in result.failed.items():
                req = self.requests.get(request_id)
                if req is not None:
                    self.fail(req, error)
        events, self._aborted_events = self._aborted_events, []
        keep = self.prefix.enabled
        if keep and plan.num_extends:
            self.prefix.keep_prefilled(plan)
        sampled = result.sampled
        logprobs = result.logprobs
        max_len = self.max_sequence_len
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
            if finished:
                if keep:
                    self.prefix.keep_last_page(req)  # a finished answer's last full page
                self.running.remove(req)
                self._partial.discard(req)
                self.pool.free(req.request_id)
                self._finish(req)
            append(make_event(TokenEvent, (req, token, finished)))
        if result.forks:
            self._fork(plan, result, events)
        return events

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
                    self.aborted_parked_ids.append(child.request_id)  # its KV copy is unused
                else:
                    self.requests[child.request_id] = child
                    self._resume_status[child.request_id] = _DECODING
                    child.status = _RETRACTED
                    self.retracted.append(child)
                events.append(TokenEvent(child, token, finished))
