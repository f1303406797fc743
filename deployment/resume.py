"""Resumption: a rank request whose rank died goes on, on a live rank, as a continuation.

The ingress holds every stream, so it knows exactly which tokens each choice has received.
When the rank under a request dies (its actor is gone, or its DP group failed), the request
is submitted again:

- no choice has a token yet: the same request, re-routed whole (one prefill for its ``n``);
- otherwise each unfinished choice as a ``Continuation``: its prompt followed by the tokens
  it already received, flagged as resumed (``GenerateRequest.num_resumed_tokens``), so the
  rank prefills them as prompt but counts them as output: toward ``max_tokens`` (the rank
  generates the remaining ones), in seeded draws and ``min_tokens`` (the output index goes on
  from where it stopped, so a seeded sampler draws the same noise per position), in presence
  and frequency penalties, and in the grammar matcher (replayed over them).

The choices themselves (``roundgate.deployment.openai.choices.Choice``) are fed by every attempt in
turn, so their detokenizer, held-back stop-string text and logprob offsets carry on across
the break, and the client sees one stream with no repeated or missing token. The rank's usage
of a continuation counts the resumed tokens as prompt; ``shift_usage`` moves them back to
completion, so usage counts the original prompt and each generated token once.

Rank death is read from the error types the rank handle raises (``RANK_LOSS``), never from
anything a client sends. Attempts are bounded: a request whose ranks failed
``max_rank_failures`` times ends with an error (a poison request must not take the group down
one rank at a time), and a resumed attempt must deliver a chunk within ``resume_timeout_s``
of the failure (a rank that never comes back ends the request, naming the rank when it was
pinned). The loop here is pure asyncio over a ``submit(message) -> stream`` function: the
HTTP answer is the ingress's.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, replace
from typing import Protocol

from roundgate.actors.control.messages import GenerateChunk, GenerateRequest, Usage
from roundgate.deployment.openai.choices import Choice, Delta, merge, run_choices

# Error classes (matched by name along the exception's MRO, so the ingress needs no Ray import
# and Ray's ``RayTaskError(GroupFailure)`` wrapper matches too) that mean the rank under the
# request is gone: its actor died or is unreachable (``RayActorError``: ``ActorDiedError``,
# ``ActorUnavailableError``), its DP group failed (the rank's ``GroupFailure``), or under P/D
# the prefill process holding its KV died before the pages moved (``PrefillRankLost``).
RANK_LOSS = frozenset({"RayActorError", "GroupFailure", "PrefillRankLost"})
# A rank whose group had already failed refused the request before running it: resubmitted
# without charging the request a rank failure (it cannot have caused it).
NOT_CHARGED = frozenset({"GroupUnavailable"})


def _names(exc: BaseException) -> set[str]:
    return {cls.__name__ for cls in type(exc).__mro__}


def is_rank_loss(exc: BaseException) -> bool:
    """Whether ``exc`` says the rank under a request is gone (``RANK_LOSS``)."""
    return bool(_names(exc) & RANK_LOSS)


def is_charged(exc: BaseException) -> bool:
    """Whether a rank loss counts toward the request's ``max_rank_failures``."""
    return not _names(exc) & NOT_CHARGED


@dataclass(frozen=True)
class ResumePolicy:
    """How hard the ingress tries to keep a request going when its rank dies.

    ``max_rank_failures``: rank losses charged to one request before it ends with an error (0:
    never resumed, the first loss is the client's error). ``resume_timeout_s``: from a loss to
    the resumed attempt's first chunk (a whole-gang restart, a replacement loading its model).
    ``first_backoff_s`` doubles per resubmission without progress, up to ``max_backoff_s``:
    a group that is still tearing down refuses at once, and is not asked again at once.
    """

    max_rank_failures: int = 3
    resume_timeout_s: float = 120.0
    first_backoff_s: float = 0.25
    max_backoff_s: float = 4.0

    def __post_init__(self) -> None:
        if self.max_rank_failures < 0:
            raise ValueError(f"max_rank_failures must be >= 0, got {self.max_rank_failures}")
        if self.resume_timeout_s <= 0:
            raise ValueError(f"resume_timeout_s must be > 0, got {self.resume_timeout_s}")
        if not 0 <= self.first_backoff_s <= self.max_backoff_s:
            raise ValueError(
                f"backoff: need 0 <= first_backoff_s ({self.first_backoff_s}) <= "
                f"max_backoff_s ({self.max_backoff_s})"
            )

    def backoff_s(self, retry: int) -> float:
        """The wait before resubmission ``retry`` (0-based) since the last progress."""
        return min(self.max_backoff_s, self.first_backoff_s * 2**retry)


def attempt_id(request_id: str, attempt: int, sequence: int | None = None) -> str:
    """The rank request id of resubmission ``attempt`` (>= 1), of one ``sequence`` when the
    request's ``n`` sequences resume apart. Fresh per attempt: Serve's router and the rank
    key pending work by id, and the failed attempt's id may linger in either."""
    suffix = f"-r{attempt}" if sequence is None else f"-r{attempt}s{sequence}"
    return request_id + suffix


@dataclass(frozen=True)
class Continuation:
    """Sequence ``sequence`` of ``original`` with ``output_ids`` already streamed to its
    choice: what a live rank must run to generate the rest."""

    original: GenerateRequest
    sequence: int
    output_ids: tuple[int, ...]

    def __post_init__(self) -> None:
        n = self.original.sampling.n
        if not 0 <= self.sequence < n:
            raise ValueError(f"sequence {self.sequence} of a request with n={n}")
        if self.num_remaining_tokens < 1:
            raise ValueError(
                f"{len(self.output_ids)} tokens already streamed: max_tokens "
                f"{self.original.sampling.max_tokens} leaves nothing to resume"
            )

    @property
    def num_remaining_tokens(self) -> int:
        return self.original.sampling.max_tokens - len(self.output_ids)

    def message(self, attempt: int) -> GenerateRequest:
        """The rank request for resubmission ``attempt``: one sequence (its own seeded stream,
        ``for_sequence``), the original sampling otherwise. Prompt logprobs only while
        nothing streamed (a sequence's first chunk carried them)."""
        original, sampling = self.original, self.original.sampling
        if sampling.n > 1:
            sampling = sampling.for_sequence(self.sequence)
        if self.output_ids:
            sampling = replace(sampling, prompt_logprobs=None)
        return replace(
            original,
            request_id=attempt_id(
                original.request_id, attempt, self.sequence if original.sampling.n > 1 else None
            ),
            prompt_token_ids=original.prompt_token_ids + self.output_ids,
            sampling=sampling,
            num_resumed_tokens=len(self.output_ids),
        )


def shift_usage(chunk: GenerateChunk, num_resumed: int) -> GenerateChunk:
    """A continuation's chunk with its usage as the client's request counts it: the resumed
    tokens (the rank's prompt tail) back among the completion tokens."""
    if not num_resumed:
        return chunk
    usage = Usage(
        prompt_tokens=chunk.usage.prompt_tokens - num_resumed,
        completion_tokens=chunk.usage.completion_tokens + num_resumed,
    )
    return replace(chunk, usage=usage)


class ResumeFailed(Exception):
    """The request cannot be resumed: too many rank failures, or no rank came back in time.
    ``code`` names which, for the client's error body."""

    def __init__(self, message: str, code: str) -> None:
        super().__init__(message)
        self.code = code


class RankStream(Protocol):
    """What the rank handle's streaming call returns."""

    def __aiter__(self) -> AsyncIterator[GenerateChunk]: ...

    def cancel(self) -> None: ...


@dataclass
class _Leg:
    """One rank request in flight and the choices it feeds (``choices[chunk.index]``)."""

    message: GenerateRequest
    choices: list[Choice]
    num_resumed: int = 0
    lost_at: float | None = None  # the first loss since the last chunk
    retries: int = 0  # resubmissions since the last chunk (the backoff's exponent)


class Resumer:
    """Runs one rank request's choices to their end across rank losses (module docstring).

    ``submit(message)`` starts a rank stream; ``on_loss(exc, message)`` hears of each loss
    (the ingress logs it and answers new requests 503 for a while); ``on_resume(kind)`` of
    each resumption that worked, when its first chunk arrives (``"rerouted"``: the request
    whole, or ``"continued"``: a continuation; the resumed-requests metric).
    """

    def __init__(
        self,
        submit: Callable[[GenerateRequest], RankStream],
        message: GenerateRequest,
        choices: list[Choice],
        policy: ResumePolicy,
        on_loss: Callable[[BaseException, GenerateRequest], None] = lambda exc, m: None,
        on_resume: Callable[[str], None] = lambda kind: None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.submit = submit
        self.original = message
        self.choices = choices
        self.policy = policy
        self.on_loss = on_loss
        self.on_resume = on_resume
        self.clock = clock
        self.num_charged = 0  # rank losses charged to this request, all its sequences together
        self.num_attempts = 0  # resubmissions so far (each gets a fresh id)

    def deltas(self) -> AsyncIterator[Delta]:
        return self._run(_Leg(self.original, self.choices))

    async def _run(self, leg: _Leg) -> AsyncIterator[Delta]:
        while True:
            stream = self.submit(leg.message)
            try:
                async for delta in run_choices(self._chunks(stream, leg), leg.choices):
                    yield delta
                return
            except Exception as exc:
                if not is_rank_loss(exc):
                    raise
                loss = exc
            finally:
                stream.cancel()
            self._charge(loss, leg)
            await self._backoff(leg)
            legs, ended = self._next_legs(leg)
            for delta in ended:
                yield delta
            if not legs:
                return
            if len(legs) == 1:
                leg = legs[0]
                continue
            async for delta in merge([self._run(one) for one in legs]):
                yield delta
            return

    async def _chunks(self, stream: RankStream, leg: _Leg) -> AsyncIterator[GenerateChunk]:
        """The stream's chunks, usage shifted; while resuming, the first one due by the
        deadline."""
        chunks = stream.__aiter__()
        while True:
            try:
                if leg.lost_at is None:
                    chunk = await anext(chunks)
                else:
                    left = leg.lost_at + self.policy.resume_timeout_s - self.clock()
                    chunk = await asyncio.wait_for(anext(chunks), max(0.0, left))
            except StopAsyncIteration:
                return
            except TimeoutError:
                raise self._timed_out(leg) from None
            if leg.lost_at is not None:  # the request goes on: a resumption that worked
                self.on_resume("continued" if leg.num_resumed else "rerouted")
            leg.lost_at, leg.retries = None, 0
            yield shift_usage(chunk, leg.num_resumed)

    def _charge(self, loss: BaseException, leg: _Leg) -> None:
        """Count ``loss`` against the bound (``ResumeFailed`` once it is reached)."""
        self.on_loss(loss, leg.message)
        if leg.lost_at is None:
            leg.lost_at = self.clock()
        limit = self.policy.max_rank_failures
        if limit == 0:  # resumption off: the loss is the client's error, as it always was
            raise ResumeFailed(
                "generation failed: the DP group is unavailable and restarting; retry shortly",
                "group_unavailable",
            ) from loss
        if is_charged(loss):
            self.num_charged += 1
        if self.num_charged > limit:
            raise ResumeFailed(
                f"generation failed: the ranks serving this request failed {self.num_charged} "
                f"times (it is resumed after at most {limit}, so that a request that brings "
                "ranks down cannot take the group down one rank at a time)",
                "resume_limit_reached",
            ) from loss

    def _timed_out(self, leg: _Leg) -> ResumeFailed:
        where = (
            "no rank"
            if leg.message.dp_rank is None
            else f"dp_rank {leg.message.dp_rank} (the rank this request is pinned to)"
        )
        received = sum(len(c.output_token_ids) for c in leg.choices)
        return ResumeFailed(
            f"generation failed: {where} came back within {self.policy.resume_timeout_s:g} s "
            f"of its rank's failure to resume this request ({received} tokens streamed)",
            "resume_timed_out",
        )

    def _next_legs(self, leg: _Leg) -> tuple[list[_Leg], list[Delta]]:
        """What to submit after ``leg`` lost its rank: itself again when no choice has a token
        yet, else one continuation per unfinished choice; and the deltas of choices that
        turn out to have ended already."""
        choices = leg.choices
        if not any(c.output_token_ids or c.finish_reason for c in choices):
            self.num_attempts += 1
            message = replace(
                leg.message, request_id=attempt_id(self.original.request_id, self.num_attempts)
            )
            return [replace(leg, message=message)], []
        legs, ended = [], []
        for choice in choices:
            if choice.finish_reason is not None:
                continue
            sequence = self.choices.index(choice)
            resumed = tuple(choice.output_token_ids)
            if len(resumed) >= self.original.sampling.max_tokens:  # the finish never came
                if (delta := _finish(choice, "length")) is not None:
                    ended.append(delta)
                continue
            self.num_attempts += 1
            message = Continuation(self.original, sequence, resumed).message(self.num_attempts)
            legs.append(
                _Leg(message, [choice], len(resumed), lost_at=leg.lost_at, retries=leg.retries)
            )
        return legs, ended

    async def _backoff(self, leg: _Leg) -> None:
        wait = self.policy.backoff_s(leg.retries)
        leg.retries += 1
        assert leg.lost_at is not None  # set by _charge
        if self.clock() + wait > leg.lost_at + self.policy.resume_timeout_s:
            raise self._timed_out(leg)
        await asyncio.sleep(wait)


def _finish(choice: Choice, reason: str) -> Delta | None:
    """End a choice whose last token arrived but whose finish was lost with its rank."""
    usage = choice.usage or Usage(prompt_tokens=len(choice.prompt_token_ids), completion_tokens=0)
    return choice.feed(GenerateChunk(token_ids=(), finish_reason=reason, usage=usage))
