"""vLLM's adaptive prefill alignment (PR #51199, ``--enable-adaptive-prefill-alignment``).

In vLLM a coordinator collects each DP engine's per-step observation (did the engine defer a
fresh prefill it could have admitted, is it capacity bound, its running and prefill batch
sizes) and, once it holds every engine's observation of one step, may issue a *release*: a
step ``target_step_lead`` steps ahead on which every engine admits its fresh prompts. The
engines apply it on that same step, then acknowledge; the next release waits for every
acknowledgment (one lease at a time). Between releases fresh prompts wait while decodes (and
prefill chunks already under way) keep running. The coordinator releases when

- every engine deferred a prompt and has slots for it (``all_prefillable``);
- an engine is capacity bound: its last release left prompts it could not take
  (``capacity_force_allow``), since holding a saturated engine only adds waiting;
- every engine is ready but slot limited (running + largest prefill batch over the per-rank
  limit): the first time per wave at once (``first_delay_skip``), else after the delay limit;
- only some engines deferred: after ``max_delay_passes`` delayed steps (``max_delay_fail_open``,
  the bounded fail-open; the count restarts with every release: recovery).

A step on which no engine deferred anything resets the delay count. A new DP wave (the group
went idle and woke up) drops any pending release and restarts the count, the release ids and
the first-delay exception.

Mapping onto one gather per round: the observation is the rank's row (``admissible``: the queue
head could be admitted; ``running``; ``max_prefill_bs``), and every rank runs the coordinator
itself on the gathered rows, so the release and its target round are the same everywhere. The
rows of round r decide a release for round ``r + target_step_lead`` (as vLLM's observation of
step s targets step s + lead). Every rank applies it on that round and the rows gathered then
are every rank's acknowledgment: with one lockstep gather an acknowledgment cannot go missing,
so vLLM's ack-timeout resync has nothing to recover here. On the release round a rank still
``admissible`` after its plan is capacity bound until its queue head no longer is. A wave
ends on a round whose rows are all idle and in which no rank wants prefill (a held prompt keeps
the wave alive, as an unfinished request keeps vLLM's engines running).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from roundgate.gate.policy import RoundByRound
from roundgate.gate.rows import RankRow, RoundView
from roundgate.gate.spec import PolicyContext, PolicySpec
from roundgate.gate.vote import GateVote

COLUMNS = ("admissible", "running", "max_prefill_bs")
_ADM, _RUN, _MP = range(len(COLUMNS))


@dataclass(frozen=True)
class VllmAlignmentConfig:
    """The PR's two knobs with its defaults (flags ``--prefill-alignment-*``)."""

    max_delay_passes: int = field(
        default=30,
        metadata={"help": "vllm-alignment: delayed steps before a release fails open"},
    )
    target_step_lead: int = field(
        default=2,
        metadata={"help": "vllm-alignment: rounds between a release decision and its round"},
    )

    def __post_init__(self) -> None:
        for flag, value in (
            ("--prefill-alignment-max-delay-passes", self.max_delay_passes),
            ("--prefill-alignment-target-step-lead", self.target_step_lead),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{flag} must be an integer >= 1, got {value!r}")


class Release(NamedTuple):
    """A release the group decided: its id within the wave, its round and why."""

    release_id: int
    target_round: int
    reason: str


RELEASE_REASONS = (
    "all_prefillable",
    "capacity_force_allow",
    "first_delay_skip",
    "max_delay_fail_open",
)
_RELEASE = {reason: GateVote(True, None, reason=reason) for reason in RELEASE_REASONS}
# Fresh prompts wait for a release; decodes and chunks already under way keep running.
_HOLD = GateVote(False, None, chunks=True, reason="hold")


class VllmAlignment(RoundByRound):
    """Every rank runs the PR's coordinator on the gathered rows: one release at a time, each
    applied by every rank on the same round."""

    extra_columns: tuple[str, ...] = COLUMNS

    def __init__(self, config: VllmAlignmentConfig, max_running_requests: int) -> None:
        self.config = config
        self.max_running_requests = max_running_requests  # per rank, as vLLM's engines report
        self.round = 0  # the round the next vote is for (restarts with each wave)
        self.wave = 0
        self.release_id = 0
        self.delayed_passes = 0
        self.pending: Release | None = None
        self.capacity_bound: tuple[bool, ...] = ()
        self.skip_first_delay = True
        self.releases: Counter[str] = Counter()

    def vote(self, rows: Sequence[RankRow], local: Any = None) -> GateVote:
        """Admit fresh prompts on a release's round only; the state moves in ``observe``."""
        pending = self.pending
        if pending is not None and pending.target_round == self.round:
            return _RELEASE[pending.reason]
        return _HOLD

    def observe(self, rows: Sequence[RankRow], view: RoundView) -> None:
        """The coordinator's ``update`` for every rank's observation of this round."""
        if view.all_idle and not any(row.wants_prefill or row.has_decode_work for row in rows):
            self.reset_wave()
            return
        this_round = self.round
        self.round += 1
        admissible = tuple(row.extras[_ADM] > 0 for row in rows)
        if self.pending is not None:
            if this_round < self.pending.target_round:
                return  # the lease is out: no decision before every rank applied it
            # Applied on this round by every rank; these rows acknowledge it. What a rank
            # could still admit after an open plan, its budget or batch could not take.
            self.pending = None
            self.release_id += 1
            self.capacity_bound = admissible
            return
        bound = self.capacity_bound or (False,) * len(rows)
        self.capacity_bound = tuple(b and a for b, a in zip(bound, admissible, strict=True))
        self._decide(rows, admissible, this_round)

    def _decide(self, rows: Sequence[RankRow], deferred: tuple[bool, ...], step: int) -> None:
        num_prefillable = sum(deferred)
        if num_prefillable == 0:
            self.delayed_passes = 0
            return
        if any(self.capacity_bound):
            return self._release(step, "capacity_force_allow")
        if num_prefillable == len(rows):
            running = max(row.extras[_RUN] for row in rows)
            max_prefill = max(row.extras[_MP] for row in rows)
            if self.max_running_requests - running < max_prefill:  # slot limited
                if self.skip_first_delay:
                    self.skip_first_delay = False
                    return self._release(step, "first_delay_skip")
                return self._delay(step)
            return self._release(step, "all_prefillable")
        return self._delay(step)

    def _delay(self, step: int) -> None:
        self.delayed_passes += 1
        if self.delayed_passes >= self.config.max_delay_passes:
            self._release(step, "max_delay_fail_open")

    def _release(self, step: int, reason: str) -> None:
        self.pending = Release(self.release_id, step + self.config.target_step_lead, reason)
        self.delayed_passes = 0
        self.releases[reason] += 1

    def reset_wave(self) -> None:
        """A new DP wave: no lease, no delay, release ids and the first-delay skip afresh."""
        self.wave += 1
        self.round = 0
        self.release_id = 0
        self.delayed_passes = 0
        self.pending = None
        self.capacity_bound = ()
        self.skip_first_delay = True


def _build(config: VllmAlignmentConfig, ctx: PolicyContext) -> VllmAlignment:
    return VllmAlignment(config, ctx.max_batch_size)


POLICY = PolicySpec(
    name="vllm-alignment",
    summary="vLLM's adaptive prefill alignment: coordinated releases a fixed lead ahead",
    config=VllmAlignmentConfig,
    build=_build,
    flag_prefix="prefill_alignment_",
)
