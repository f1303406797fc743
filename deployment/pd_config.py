"""A P/D deployment's roles: shared settings once, a section per role, validated together.

``args`` of a P/D deployment hold the engine flags both roles share (model, page size,
tokenizer, device...) at the top level, and a ``prefill`` and a ``decode`` section with what
differs (ranks, CPUs, max scheduled tokens; dp size, max sequences, KV pages)::

    model: smollm2-135m-instruct        # shared: once
    page_size: 16
    prefill: {dp_size: 1, max_scheduled_tokens: 512, num_cpus_per_rank: 0.5}
    decode: {dp_size: 1, max_num_seqs: 64, num_kv_pages: 512, num_cpus_per_rank: 0.5}

Each role's ``ServerArgs`` is the shared flags, the section's on top, and its
``disaggregation_mode``; the roles are then paired (one model, one page layout, one context
length: ``roundgate.actors.pd_roles``, the rule's one home) and each is checked against one
request (its pool holds a full-length one).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from roundgate.actors import pd_roles
from roundgate.actors.server_args import ServerArgs, engine_arg_names
from roundgate.gate import registry

# A P/D deployment's sections, one per disaggregated role (each also its role's value).
ROLES = pd_roles.PD_ROLES


class RoleArgs(BaseModel):
    """One role's section: engine flags that differ from the shared ones, and its resources."""

    model_config = ConfigDict(extra="forbid")

    engine: dict[str, Any] = Field(default_factory=dict, description="this role's ServerArgs")
    num_cpus_per_rank: float | None = Field(None, gt=0, description="default: the shared one")
    num_gpus_per_rank: float | None = Field(None, ge=0, description="default: the shared one")
    resources_per_rank: dict[str, float] | None = Field(
        None, description="Ray custom resources per rank (default: the shared ones)"
    )


def split_role(role: str, data: Any) -> Any:
    """A flat role section (``{dp_size: 1, num_cpus_per_rank: 0.5}``) as ``RoleArgs`` input;
    a key that is neither an engine flag nor a resource is refused naming the section."""
    if not isinstance(data, dict):
        return data
    data = dict(data)
    engine = dict(data.pop("engine", None) or {})
    names = set(engine_arg_names())
    for key in list(data):
        if key in names:
            engine[key] = data.pop(key)
        elif key not in RoleArgs.model_fields:
            raise ValueError(f"{role}.{key}: not an engine flag or a role resource")
    data["engine"] = engine
    return data


def role_server_args(shared: dict[str, Any], roles: dict[str, RoleArgs]) -> dict[str, ServerArgs]:
    """Each role's validated ``ServerArgs`` (built and paired by ``roundgate.actors.pd_roles``);
    every refusal names the role (and the flag)."""
    if "disaggregation_mode" in shared:
        raise ValueError(
            "disaggregation_mode: a P/D deployment sets each role's mode from its section"
        )
    gate_flags = {"prefill_policy", *registry.all_flags()}
    for role in ROLES:
        section = roles[role].engine
        for where, values in (("", shared), (f"{role}.", section)):
            given = sorted(k for k in gate_flags & set(values) if values[k] is not None)
            if given:
                raise ValueError(
                    f"{where}{given[0]}: a P/D deployment runs no prefill gate (the prefill "
                    "role only prefills, the decode role only decodes); drop the gate's flags"
                )
        if "disaggregation_mode" in section:
            raise ValueError(f"{role}.disaggregation_mode: the section's role sets it")
    sections = {role: roles[role].engine for role in ROLES}
    built = dict(zip(ROLES, pd_roles.role_server_args(shared, sections), strict=True))
    for role, args in built.items():
        check_fits_one_request(role, args)
    return built


def check_fits_one_request(role: str, args: ServerArgs) -> None:
    """A role's pool must hold one request of the full context length, else that request
    could never be admitted (prefill) or receive its KV (decode)."""
    need = -(-args.max_model_len // args.page_size)
    if args.num_kv_pages < need:
        raise ValueError(
            f"{role}.num_kv_pages {args.num_kv_pages} holds {args.num_kv_pages * args.page_size} "
            f"tokens, less than one request of max_model_len {args.max_model_len} "
            f"({need} pages of {args.page_size}): raise it or lower max_model_len"
        )
