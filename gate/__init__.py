"""Pure prefill-gating policy: no torch, no Ray, no clocks."""

from gate.delay import PrefillDelay
from gate.group_gate import GateVote, GroupGate
from gate.local_interval import LocalIntervalPolicy
from gate.rows import COLUMNS, RankRow

__all__ = ["COLUMNS", "GateVote", "GroupGate", "LocalIntervalPolicy", "PrefillDelay", "RankRow"]
