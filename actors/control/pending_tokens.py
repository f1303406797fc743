"""Tokens a forward is still sampling: counted when its round is queued, valued a round later.

Under ``--async-scheduling`` a rank plans round N+1 while round N's forward runs, so round N's
sampled tokens are not known when round N+1 is planned. This part splits the scheduler's
``update`` in two, around that gap (vLLM's async scheduling and SGLang's overlap scheduler
make the same cut):

    advance(plan N)                  right after round N's forward is queued, before plan N+1:
                                     each sampling chunk appends PLACEHOLDER to its request's
                                     output; one that reaches max_tokens or the context length
                                     with it finishes now (a length needs no token value), so
                                     plan N+1 sees the slots, pages and counts the synchronous
                                     update would have left
    resolve(plan N, pending, result) once round N's result is in (while round N+1's forward
                                     runs): the placeholders take their values, a stop token
                                     finishes its request, logprobs are appended and the
                                     round's events go out

What plan N+1 cannot know is a *stop token* (EOS, ``stop_token_ids``) or a failure sampled in
round N: such a request is planned once more, and its round N+1 output is discarded (the
forward thread drops its chunk before the forward; see ``async_rounds.py``). Its slot and pages
are freed by ``resolve``, one plan later than the synchronous update frees them.
"""

from __future__ import annotations

from typing import NamedTuple

from roundgate.actors.control.request import Request, RequestStatus
from roundgate.actors.control.round import RoundPlan, RoundResult, TokenEvent
from roundgate.actors.control.scheduler import Scheduler

# The value an output token holds until its forward's result is applied. Never a vocabulary
# id (intake refuses negative ids), so never a stop token: ``append_token`` applied to it
# checks the length limits alone.
PLACEHOLDER = -1

_DECODING = RequestStatus.DECODING
_RETRACTED = RequestStatus.RETRACTED
_LENGTH = RequestStatus.FINISHED_LENGTH
_STOPPED = RequestStatus.FINISHED_STOPPED


class PendingToken(NamedTuple):
    """One placeholder: ``request.output_token_ids[index]`` waits for its round's result
    (a named tuple: one per sampling request per round)."""

    request: Request
    index: int


class PendingTokens:
    """The scheduler's update, split for overlapped rounds (one per ``Scheduler``).

    It changes the scheduler only through what ``update`` itself uses: its queues, pool,
    prefix cache, endings part and ``retire``.
    """

    def __init__(self, scheduler: Scheduler) -> None:
        self.scheduler = scheduler
        # Retracted requests that a stop token ended before readmission: their KV is parked by
        # the forward already queued, so the executor lets go of it one round later.
        self._parked_to_drop: list[str] = []

    def advance(self, plan: RoundPlan) -> list[PendingToken]:
        """Count round ``plan``'s tokens before their values exist (see the module doc)."""
        scheduler = self.scheduler
        if scheduler.prefix.enabled and plan.num_extends:
            # The prompt's pages are keyed from its tokens, known already; the forward that
            # writes them runs before any forward that could read them (one worker, in order).
            scheduler.prefix.keep_prefilled(plan)
        pending: list[PendingToken] = []
        max_len = scheduler.max_sequence_len
        for req, start, num_tokens, _ in plan.chunks:
            if req.status >= _RETRACTED:
                continue
            output = req.output_token_ids
            if start + num_tokens < req.num_prompt_tokens + len(output):
                continue  # a prompt chunk short of the prompt's end samples nothing
            req.status = _DECODING
            pending.append(PendingToken(req, len(output)))
            if req.append_token(PLACEHOLDER, max_len):  # a length limit: known now
                scheduler.retire(req)
        return pending

    def resolve(
        self,
        plan: RoundPlan,
        pending: list[PendingToken],
        result: RoundResult,
        next_plan: RoundPlan | None = None,
    ) -> list[TokenEvent]:
        """Give round ``plan``'s placeholders their values; the round's events, in the
        order ``update`` emits a request's (its token, then any final event).

        ``next_plan`` is the plan made meanwhile: a request this result ends leaves it, its
        computed count with it, as the forward's copy already dropped it (so its pages are
        freed, and its last page keyed, exactly as the synchronous update would)."""
        scheduler = self.scheduler
        ends = scheduler.ends
        if self._parked_to_drop:  # the forward that parked them has finished
            ends.aborted_parked_ids.extend(self._parked_to_drop)
            self._parked_to_drop.clear()
        failed = result.failed
        if failed:
            self._fail(pending, failed, next_plan)
        if result.prompt_logprobs:
            for request_id, entries in result.prompt_logprobs.items():
                req = scheduler.queues.requests.get(request_id)
                if req is not None and not req.is_finished:
                    req.prompt_logprobs.extend(entries)
        sampled, logprobs = result.sampled, result.logprobs
        events: list[TokenEvent] = []
        for req, index in pending:
            request_id = req.request_id
            if request_id in failed:
                continue
            token = sampled[request_id]
            req.output_token_ids[index] = token
            if logprobs and request_id in logprobs:
                req.output_logprobs.append(logprobs[request_id])
            status = req.status
            finished = status is _LENGTH
            if token in req.sampling.stop_token_ids and (status <= _LENGTH):
                # ``append_token`` checks the stop token before the length: so does this.
                finished = True
                if status is _DECODING:
                    if next_plan is not None:
                        next_plan.unplan(req)
                    req.status = _STOPPED
                    scheduler.retire(req)
                elif status is _RETRACTED:  # retracted by the plan made meanwhile
                    req.status = _STOPPED
                    scheduler.queues.remove(req)
                    scheduler.waits.forget(req)
                    self._parked_to_drop.append(request_id)
            events.append(TokenEvent(req, token, finished))
        if ends.events:  # failures of this round, aborts applied by the plan made meanwhile
            events.extend(ends.take_events())
        return events

    def _fail(
        self, pending: list[PendingToken], failed: dict[str, str], next_plan: RoundPlan | None
    ) -> None:
        """Requests whose forward failed this round fail alone, their placeholder removed
        (as ``update`` fails them: no token, one final event)."""
        scheduler = self.scheduler
        for req, index in pending:
            error = failed.get(req.request_id)
            if error is None:
                continue
            del req.output_token_ids[index:]
            if req.status is _LENGTH:  # retired by ``advance``: only its ending changes
                req.status = RequestStatus.FINISHED_ERROR
                req.error = error
                scheduler.ends.num_failures += 1
                scheduler.ends.events.append(TokenEvent(req, None, True))
            elif not req.is_finished:
                retracted = req.status is _RETRACTED
                scheduler.ends.fail(req, error, next_plan)
                if retracted:  # parked by the forward in flight: let go of it after that one
                    scheduler.ends.aborted_parked_ids.remove(req.request_id)
                    self._parked_to_drop.append(req.request_id)
