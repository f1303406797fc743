"""The settings several routers share: the load limits and session affinity.

Declared once here (default, help, bound); the policies' configs take their defaults from
these, the serve config and ``roundgate simulate`` their keys and flags.
"""

from __future__ import annotations

from roundgate.routing.spec import Option, Spell

# SGLang router's defaults.
BALANCE_ABS_THRESHOLD = Option(
    "balance_abs_threshold",
    int,
    32,
    "load limit: a rank more than this many requests above the least loaded is passed over "
    "(when also past the relative limit)",
    minimum=0,
)
BALANCE_REL_THRESHOLD = Option(
    "balance_rel_threshold",
    float,
    1.0001,
    "load limit: ... and more than this many times the least loaded's load",
    minimum=1.0,
)
SESSION_AFFINITY = Option(
    "session_affinity", bool, False, "a session's turns (the API's user field) follow its last rank"
)
BALANCE = (BALANCE_ABS_THRESHOLD, BALANCE_REL_THRESHOLD)


def check_balance(abs_threshold: int, rel_threshold: float, spell: Spell) -> None:
    """The load limits every router shares: ``spell`` names a field as its caller's users
    know it (a config field, or a ``--flag``)."""
    BALANCE_ABS_THRESHOLD.check(abs_threshold, spell)
    BALANCE_REL_THRESHOLD.check(rel_threshold, spell)
