"""P/D's two roles: their ``ServerArgs``, built one way, and the rule that pairs them.

A prefill rank hands a request's KV pages and its first token to a decode rank, so the two
roles must agree on whatever shapes those pages and tokens (``MUST_MATCH``). Every P/D path
builds its roles with ``role_server_args`` (the served app from its config's shared flags and
sections, ``roundgate.deployment.pd_config``; the simulator from a fused group's args,
``roundgate.sim.disaggregated``), and every engine that pairs two roles checks them with
``check_pair`` (``roundgate.actors.disaggregated``, the simulator): the rule lives here only.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from roundgate.actors.role import DisaggregationRole
from roundgate.actors.server_args import ServerArgs

# A P/D deployment's roles, in the order their sections and results are given.
PD_ROLES = (DisaggregationRole.PREFILL, DisaggregationRole.DECODE)
# What the KV pages (model, page layout, context, device) and the ingress's one tokenizer and
# sampling (chat template, seed) need both roles to agree on.
MUST_MATCH = ("model", "page_size", "chat_template", "max_model_len", "device", "seed")


def check_pair(prefill: ServerArgs, decode: ServerArgs) -> None:
    """Refuse two roles that cannot hand requests to each other, naming the field (each
    role's ``--disaggregation-mode``, then ``MUST_MATCH``'s)."""
    for role, args in zip(PD_ROLES, (prefill, decode), strict=True):
        if args.disaggregation_mode is not role:
            raise ValueError(
                f"the {role} role needs --disaggregation-mode {role}, got "
                f"{args.disaggregation_mode.value!r}"
            )
    for name in MUST_MATCH:
        mine, theirs = getattr(prefill, name), getattr(decode, name)
        if mine != theirs:
            raise ValueError(
                f"prefill.{name} {mine!r} and decode.{name} {theirs!r} differ: both roles must "
                f"have the same --{name.replace('_', '-')} (KV pages move between them)"
            )


def role_server_args(
    shared: Mapping[str, Any], sections: Mapping[DisaggregationRole, Mapping[str, Any]]
) -> tuple[ServerArgs, ServerArgs]:
    """The (prefill, decode) roles' validated ``ServerArgs``: ``shared``'s flags, the role's
    section on top, and the role's ``disaggregation_mode``; then paired (``check_pair``).
    A refusal names the role."""
    built = []
    for role in PD_ROLES:
        try:
            built.append(ServerArgs(**{**shared, **sections[role], "disaggregation_mode": role}))
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{role} role: {exc}") from None
    prefill, decode = built
    check_pair(prefill, decode)
    return prefill, decode
