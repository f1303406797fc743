"""Pure prefill-gating policy: no torch, no Ray, no clocks.

``rows`` (the gathered row and its one reading), ``vote`` (a policy's decision), ``policy``
(the interface), ``spec`` + ``registry`` (policies by name and their flags), and one module per
policy: ``group_gate`` (roundgate), ``auto``, ``no_gate``, ``local_interval`` and the six peers.
"""

from roundgate.gate.delay import PrefillDelay
from roundgate.gate.group_gate import GroupGate
from roundgate.gate.local_interval import LocalIntervalPolicy
from roundgate.gate.rows import COLUMNS, RankRow, RoundView, read_rows
from roundgate.gate.vote import GateVote

__all__ = [
    "COLUMNS",
    "GateVote",
    "GroupGate",
    "LocalIntervalPolicy",
    "PrefillDelay",
    "RankRow",
    "RoundView",
    "read_rows",
]
