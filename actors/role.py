"""A rank's role in P/D disaggregation: the one enum every layer above the control plane names.

Its own module because the flags (``server_args``), the pairing rule (``pd_roles``), the
rank's composed role (``actors/replica``), the ingress's routes and the simulator all speak of
it, and none of them is where it belongs.
"""

from __future__ import annotations

import enum


class DisaggregationRole(enum.StrEnum):
    """What one rank does with a request's KV (``--disaggregation-mode``).

    ``FUSED`` prefills and decodes; ``PREFILL`` computes a prompt's KV and first token, then
    hands the request to a decode rank; ``DECODE`` takes handoffs, receives their KV, and only
    decodes. The KV crosses between the two through the scheduler's connector
    (``roundgate.actors.control.kv_connector``).
    """

    FUSED = "fused"
    PREFILL = "prefill"
    DECODE = "decode"

    @classmethod
    def parse(cls, value: object) -> DisaggregationRole:
        """The role a flag value names. ``null`` (this flag's spelling of the fused role
        before the enum) is ``FUSED``, and so is a YAML serve config's bare ``null`` (None);
        anything else not a role is refused naming the flag."""
        if value is None or value == _NULL:
            return cls.FUSED
        try:
            return cls(value)
        except ValueError:
            raise ValueError(
                f"--disaggregation-mode must be one of {', '.join(DISAGGREGATION_MODES)}, "
                f"got {value!r}"
            ) from None


_NULL = "null"
# The flag's values: the roles', and ``null`` for the fused role (command lines and configs).
DISAGGREGATION_MODES = (*(role.value for role in DisaggregationRole), _NULL)
