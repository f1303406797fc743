"""How a rank's round is filled: readmissions, decodes, prefill chunks, and retraction.

The scheduler's planning part: it reads and moves the rank's queues and pool within the
round's token budget, stamps each prompt's first prefill round, and fails alone (through the
endings part) a request whose planning raises.
"""

from __future__ import annotations

import logging
from collections import deque

from roundgate.actors.control.admission import AdmissionWaits
from roundgate.actors.control.config import SchedulerConfig
from roundgate.actors.control.endings import RequestEnds
from roundgate.actors.control.kv_connector import KVConnector
from roundgate.actors.control.kv_pool import KVPool
from roundgate.actors.control.prefix_cache import PrefixCache
from roundgate.actors.control.queues import RequestQueues
from roundgate.actors.control.request import Request, RequestStatus
from roundgate.actors.control.round import RoundPlan, ScheduledChunk
from roundgate.actors.control.speculation import Speculator
from roundgate.actors.role import DisaggregationRole
from roundgate.gate.permission import ALLOW_ALL, Permission

logger = logging.getLogger("roundgate.scheduler")

# Above this KV occupancy a rank admits no new prompt (and its probe wants no prefill for one).
PREFILL_WATERMARK = 0.9
# Prefill batch sizes remembered for SGLang's ``max_prefill_bs`` column (its window length).
PREFILL_SIZE_WINDOW = 16
_RETRACTED = RequestStatus.RETRACTED


class RoundPlanner:
    """Chooses a round's chunks within its token budget and the rank's pool; one per
    ``Scheduler``, over its queues, pool, prefix cache and admission waits."""

    def __init__(
        self,
        config: SchedulerConfig,
        queues: RequestQueues,
        pool: KVPool,
        prefix: PrefixCache,
        waits: AdmissionWaits,
        ends: RequestEnds,
        connector: KVConnector,
    ) -> None:
        self.max_batch_size = config.max_batch_size
        self.max_scheduled_tokens = config.max_scheduled_tokens
        self.is_mixed = config.enable_mixed_prefill_decode
        self.queues = queues
        self.pool = pool
        self.prefix = prefix
        self.waits = waits
        self.ends = ends
        # The rank's KV connector; on a decode rank its reservations replace prefill.
        self.connector = connector
        self.is_decode_rank = config.disaggregation_mode is DisaggregationRole.DECODE
        # Draft tokens for decodes (speculative decoding), or None.
        self.speculator = (
            Speculator(config.speculative, config.max_model_len)
            if config.speculative is not None
            else None
        )
        self.num_retractions = 0
        # New-prompt and chunk counts of recent prefill rounds (SGLang's max_prefill_bs).
        self.prefill_sizes: deque[int] = deque(maxlen=PREFILL_SIZE_WINDOW)
        # The round being planned (``plan``'s argument), for the first-prefill stamps.
        self._round = 0

    @property
    def is_excused(self) -> bool:
        """Whether a waiting prompt is held this round by pressure or a full batch (reasons
        the gate does not own), which its admission wait does not count."""
        queues = self.queues
        return bool(queues.waiting) and (
            self.pool.occupancy > PREFILL_WATERMARK or len(queues.running) >= self.max_batch_size
        )

    def plan(self, permission: Permission, round_index: int) -> RoundPlan:
        """Choose round ``round_index``'s work under the policy's permission (new prompts,
        resident chunks, both or neither)."""
        allow = permission.allow_new or permission.allow_chunks
        self._round = round_index
        plan = RoundPlan(permission=permission)
        queues = self.queues
        if queues.retracted:
            self._readmit(plan)
        if self.is_decode_rank:
            # Reservations for handoffs take the place of prefill, and every chunk it runs is
            # a decode (no permission needed).
            self.connector.plan(plan)
            if queues.running:
                self._plan_decodes(plan, self.max_scheduled_tokens)
            return plan
        if not queues.running and not queues.waiting:
            return plan  # nothing to plan: the common case of an idle rank in a busy group
        budget = self.max_scheduled_tokens
        if self.is_mixed:
            # Decodes first; while prefill may run, hold back room for it in the budget.
            reserve = min(self.pending_prefill_tokens(permission), budget // 2) if allow else 0
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
        if queues.waiting and self.is_excused:
            self.waits.excuse()
        return plan

    def _readmit(self, plan: RoundPlan) -> None:
        """Bring retracted requests back (a cache restore: no prefill tokens, gate or not)."""
        queues = self.queues
        retracted, running = queues.retracted, queues.running
        while retracted and len(running) < self.max_batch_size:
            req = retracted[0]
            # Room for its cached tokens plus the next one it will write.
            try:
                if self.pool.allocate(req.request_id, req.num_computed_tokens + 1) is None:
                    break
            except Exception as exc:
                self._planning_failed(req, plan, exc)
                continue
            retracted.popleft()
            req.page_ids = self.pool.pages_of(req.request_id)
            req.status = queues.resume_status.pop(req.request_id)
            running.append(req)
            if req.num_computed_tokens < req.num_prompt_tokens:
                queues.partial.add(req)
            plan.readmitted.append(req)

    def _plan_decodes(self, plan: RoundPlan, budget: int) -> int:
        """Schedule one token per decoding request; retract the newest under KV pressure.

        The hot loop of the control plane (every running request, every round): locals are
        bound once, and ``KVPool.grow`` checks and extends in one call.
        """
        running = self.queues.running
        grow = self.pool.grow
        page_size = self.pool.page_size
        append = plan.chunks.append
        # ScheduledChunk(...) without its keyword-parsing __new__: one is built per decode per
        # round, a visible share of the rank-round (benchmarks/bench_control_plane.py).
        make_chunk = tuple.__new__
        speculator = self.speculator
        used = 0
        i = 0
        num_running = len(running)  # changes only by retraction, in the slow branch below
        while i < num_running and used < budget:
            req = running[i]
            computed = req.num_computed_tokens
            prompt = req.num_prompt_tokens
            if computed < prompt:
                i += 1
                continue
            # ``req.page_ids`` is the pool's live page list while the request is resident (set
            # at admission and readmission), so most rounds need no pool call at all.
            need = prompt + len(req.output_token_ids)
            if need > len(req.page_ids) * page_size:
                try:
                    if self.prefix.enabled:
                        # Its last page filled up in earlier rounds: key it (the decode path's
                        # one prefix-cache step, taken once a page, never in the common case).
                        self.prefix.keep_last_page(req)
                    while not grow(req.request_id, need):
                        victim = running[-1]
                        self._retract(victim, plan)
                        if victim is req:
                            break
                except Exception as exc:  # it left ``running``: the next one is at ``i``
                    self._planning_failed(req, plan, exc)
                    num_running = len(running)
                    continue
                num_running = len(running)
                if req.status is _RETRACTED:
                    break
            num_tokens = 1
            if speculator is not None:
                # Drafts ride in the decode chunk (verified by the same forward), only where
                # the budget and the pool have room for them: never a retraction for a draft.
                drafts = speculator.drafts_for(req, budget - used - 1)
                if drafts and not grow(req.request_id, need + len(drafts)):
                    drafts = ()
                req.drafts = drafts
                num_tokens += len(drafts)
            append(make_chunk(ScheduledChunk, (req, computed, num_tokens, False)))
            req.num_computed_tokens = computed + 1
            used += num_tokens
            i += 1
        return used

    def _retract(self, req: Request, plan: RoundPlan) -> None:
        old_pages = list(self.pool.pages_of(req.request_id))
        if plan.page_copies:
            self.prefix.retarget_copies(old_pages, plan)
        self.pool.free(req.request_id)
        queues = self.queues
        queues.running.remove(req)
        queues.partial.discard(req)
        queues.resume_status[req.request_id] = req.status
        req.status = RequestStatus.RETRACTED
        req.page_ids = []
        if req in plan.readmitted:
            # Readmitted earlier in this very plan: its restore has not run, so its parked
            # copy is still the valid one; parking its new (unwritten) pages would replace it.
            plan.readmitted.remove(req)
            queues.retracted.appendleft(req)
        else:
            queues.retracted.append(req)
            plan.retracted.append((req, old_pages))
        # A chunk of it already planned this round would now write into freed pages.
        plan.unplan(req)
        self.num_retractions += 1

    def _planning_failed(self, req: Request, plan: RoundPlan, exc: Exception) -> None:
        """A request whose planning raised fails alone; the round goes on without it."""
        logger.exception("request %s: planning failed; failing it alone", req.request_id)
        self.ends.fail(req, f"internal error while scheduling the request: {exc}", plan)

    def _plan_prefill(self, plan: RoundPlan, budget: int, permission: Permission) -> None:
        """Resident chunks first, then new prompts, within the token budget and the pool."""
        queues = self.queues
        running = queues.running
        if queues.partial and permission.allow_chunks:
            for req in running:
                if budget <= 0:
                    return
                if req.num_computed_tokens < req.num_prompt_tokens:
                    try:
                        budget -= self._schedule_chunk(plan, req, budget, may_retract=True)
                    except Exception as exc:
                        # It leaves ``running``: the next request waits for the next round.
                        self._planning_failed(req, plan, exc)
        elif budget <= 0 and running:
            return
        if not permission.allow_new:
            return
        while budget > 0 and queues.waiting and len(running) < self.max_batch_size:
            if self.pool.occupancy > PREFILL_WATERMARK:
                return
            req = queues.first_schedulable()
            if req is None:
                return  # only prompts still loading (a grammar compiling) are waiting
            try:
                # Admission starts the prompt on its cached prefix (when prefix caching is on).
                hit = self.prefix.admit(req)
                if hit is None:
                    return
                queues.take_waiting(req)
                req.num_computed_tokens = hit.num_cached_tokens
                req.page_ids = self.pool.pages_of(req.request_id)
                req.status = RequestStatus.PREFILLING
                running.append(req)
                queues.partial.add(req)
                scheduled = self._schedule_chunk(plan, req, budget, may_retract=False)
            except Exception as exc:
                self._planning_failed(req, plan, exc)
                continue
            if scheduled == 0:
                # Admitted but no page to start on: back to the head of the queue.
                running.pop()
                queues.partial.discard(req)
                self.pool.free(req.request_id)
                req.page_ids = []
                req.num_computed_tokens = 0
                req.status = RequestStatus.WAITING
                queues.waiting.appendleft(req)
                return
            self.prefix.record(req, hit, plan)
            budget -= scheduled

    def _schedule_chunk(self, plan: RoundPlan, req: Request, budget: int, may_retract: bool) -> int:
        """Grant pages for the next chunk of ``req`` (as many tokens as fit) and plan it."""
        start = req.num_computed_tokens
        want = min(req.num_prompt_tokens - start, budget)
        fits = self._fitting_tokens(req, start, want)
        # An eligible resident chunk with no room at all may retract the newest other request,
        # so a half-prefilled prompt cannot deadlock against decodes holding the pool.
        running = self.queues.running
        while fits == 0 and may_retract and running[-1] is not req:
            self._retract(running[-1], plan)
            fits = self._fitting_tokens(req, start, want)
        if fits == 0:
            return 0
        self.pool.extend(req.request_id, start + fits)
        plan.chunks.append(ScheduledChunk(req, start, fits, True))
        req.num_computed_tokens += fits
        if req.num_computed_tokens >= req.num_prompt_tokens:
            self.queues.partial.discard(req)
        if req.first_prefill_round is None:
            self.waits.first_prefill(req, self._round)
        return fits

    def _fitting_tokens(self, req: Request, start: int, want: int) -> int:
        held = len(self.pool.pages_of(req.request_id)) * self.pool.page_size
        room = held + self.pool.num_free_pages * self.pool.page_size - start
        return max(0, min(want, room))

    def pending_prefill_tokens(self, permission: Permission = ALLOW_ALL) -> int:
        """Prefill tokens the permission could plan: resident chunks, else the next prompt."""
        queues = self.queues
        resident = 0
        if permission.allow_chunks:
            resident = sum(r.num_uncomputed_prompt_tokens for r in queues.partial)
        if resident or not permission.allow_new:
            return resident
        return self.prefix.num_uncached_tokens(queues.waiting[0]) if queues.waiting else 0
