"""Autoscaling in whole DP groups: the ``autoscaling`` app arg.

A group is ``dp_size`` rank replicas that gather every round, so a replica count that is not
a multiple of ``dp_size`` is a group short of ranks: useless until it fills, and a collective
that waits on a rank that will never come. Serve's gang scheduling already scales a gang
deployment in whole gangs (it rounds the policy's replica count up to a gang multiple and
starts and stops gangs atomically), so this asks it for a replica range in groups and a
per-rank load target. Elastic DP is refused: its ranks are single replicas (a group short of
a rank after a fault is elastic DP's to heal, not the autoscaler's), and Serve would add and
remove them one at a time.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator


class GroupAutoscaling(BaseModel):
    """How many groups Serve may run, and the load that adds or removes one."""

    model_config = ConfigDict(extra="forbid")

    min_groups: int = Field(1, ge=1)
    max_groups: int = Field(..., ge=1)
    target_ongoing_requests_per_rank: float = Field(
        16.0, gt=0, description="Serve's target_ongoing_requests, per rank replica"
    )
    upscale_delay_s: float = Field(30.0, ge=0)
    downscale_delay_s: float = Field(600.0, ge=0)
    look_back_period_s: float = Field(30.0, gt=0, description="the load is averaged over it")

    @model_validator(mode="after")
    def _check(self) -> GroupAutoscaling:
        if self.min_groups > self.max_groups:
            raise ValueError(
                f"autoscaling: min_groups ({self.min_groups}) > max_groups ({self.max_groups})"
            )
        return self

    def serve_options(self, num_groups: int, dp_size: int) -> dict[str, Any]:
        """The rank deployment's replica options: ``num_groups`` groups to start with."""
        if not self.min_groups <= num_groups <= self.max_groups:
            raise ValueError(
                f"autoscaling: num_groups ({num_groups}) must lie in min_groups.."
                f"max_groups ({self.min_groups}..{self.max_groups}); it is the first count"
            )
        return {
            "num_replicas": "auto",
            "autoscaling_config": {
                "min_replicas": self.min_groups * dp_size,
                "max_replicas": self.max_groups * dp_size,
                "initial_replicas": num_groups * dp_size,
                "target_ongoing_requests": self.target_ongoing_requests_per_rank,
                "upscale_delay_s": self.upscale_delay_s,
                "downscale_delay_s": self.downscale_delay_s,
                "look_back_period_s": self.look_back_period_s,
            },
        }
