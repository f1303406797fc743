"""The two intervals that make up the group prefill gate (the ``roundgate`` policy's config)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class PrefillDelay:
    """How often the group gate may open, in rounds since the last prefill round.

    ``attempt_interval`` spaces the ALL points (throughput knob: open only when every rank that
    would decode also has prefill backlog). ``any_interval`` spaces the ANY points (latency
    bound: one rank's backlog is enough). ANY must not come more often than ALL, otherwise a
    burst could never see two ALL points in a row.
    """

    attempt_interval: int = field(
        metadata={
            "flag": "prefill_attempt_interval",
            "help": "group gate: rounds between ALL attempt points (set with the ANY interval)",
            "sim_default": 4,
        }
    )
    any_interval: int = field(
        metadata={
            "flag": "prefill_any_attempt_interval",
            "help": "group gate: rounds between ANY attempt points, the admission latency bound",
            "sim_default": 16,
        }
    )

    def __post_init__(self) -> None:
        for flag, value in (
            ("--prefill-attempt-interval", self.attempt_interval),
            ("--prefill-any-attempt-interval", self.any_interval),
        ):
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"{flag} must be an integer, got {value!r}")
            if value < 1:
                raise ValueError(f"{flag} must be >= 1, got {value}")
        if self.any_interval < self.attempt_interval:
            raise ValueError(
                f"--prefill-any-attempt-interval ({self.any_interval}) must be >= "
                f"--prefill-attempt-interval ({self.attempt_interval})"
            )
