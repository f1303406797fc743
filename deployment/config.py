"""The deployment's arguments: a pydantic model validated before any replica starts."""

from __future__ import annotations

import os
from typing import Any, Literal

from pydantic import ConfigDict, Field, PrivateAttr, create_model, model_validator

from roundgate.actors.control.request import DEFAULT_MAX_LOGPROBS
from roundgate.actors.server_args import ServerArgs, engine_arg_names
from roundgate.deployment.autoscaling import GroupAutoscaling
from roundgate.deployment.openai.grammar_limits import GrammarLimits
from roundgate.deployment.pd_config import ROLES, RoleArgs, role_server_args, split_role
from roundgate.routing import registry
from roundgate.routing.spec import Option, key

_GRAMMAR = GrammarLimits()  # the defaults live with the limits' checks


def _annotation(option: Option) -> Any:
    """A router setting's type in the serve config (a weight list is a YAML list)."""
    kind: Any = list[int] if option.kind is tuple else option.kind
    return kind | None if option.default is None else kind


def _router_fields() -> dict[str, Any]:
    """``router`` (the serve choices) and every setting of a router Serve runs, each with its
    default, bound and help as the router module declares them (``roundgate.routing.registry``)."""
    router = Field(
        registry.DEFAULT, description="where the ingress sends each request (docs/routing.md)"
    )
    fields: dict[str, Any] = {"router": (Literal[registry.names("serve")], router)}
    for option in registry.options("serve"):
        field = Field(option.default, ge=option.minimum, description=option.help)
        fields[option.name] = (_annotation(option), field)
    return fields


# The serve config's router keys, derived from the routers' declarations: a new router's
# settings become keys here without an edit. ``AppArgs`` adds the rest.
RouterArgs = create_model("RouterArgs", __config__=ConfigDict(extra="forbid"), **_router_fields())


class AppArgs(RouterArgs):
    """``build_app`` arguments: every engine flag plus how the groups are served.

    Unknown keys are refused (a typo in a config must not be silently ignored). The engine
    flags become one ``ServerArgs`` at validation (``server_args()`` returns it), so a process
    that validates its ``AppArgs`` validates its ``ServerArgs`` exactly once. The router keys
    (``router`` and the routers' settings) are ``RouterArgs``', checked against the routers'
    declarations (``roundgate.routing.registry.check``: a setting no router of the deployment reads
    is refused by name).
    """

    model_config = ConfigDict(extra="forbid")

    engine: dict[str, Any] = Field(default_factory=dict, description="ServerArgs fields")
    num_groups: int = Field(1, ge=1, description="DP groups; replicas = num_groups * dp_size")
    model_name: str | None = Field(None, description="name served in /v1/models")
    api_key: str | list[str] | None = Field(
        None,
        description="bearer key, or several (any one is accepted, as vLLM's --api-key); "
        "default $ROUNDGATE_API_KEY",
    )
    max_request_bytes: int = Field(
        1 << 20, ge=1024, description="largest request body, bytes (413 past it)"
    )
    max_logprobs: int = Field(
        DEFAULT_MAX_LOGPROBS,
        ge=-1,
        description="top logprobs a request may ask for per token (vLLM's --max-logprobs); "
        "-1: the whole vocabulary",
    )
    max_prompts_per_request: int = Field(
        256, ge=1, description="prompts one completion request may batch (400 past it)"
    )
    # Structured-output grammars past these are a 400 at the ingress (grammar_limits.py).
    max_grammar_bytes: int = Field(
        _GRAMMAR.max_grammar_bytes, ge=1, description="bytes of a structured-output grammar"
    )
    max_grammar_properties: int = Field(
        _GRAMMAR.max_grammar_properties, ge=1, description="JSON schema object properties"
    )
    max_grammar_depth: int = Field(
        _GRAMMAR.max_grammar_depth, ge=1, description="JSON nesting levels of a schema"
    )
    max_grammar_regex_chars: int = Field(
        _GRAMMAR.max_grammar_regex_chars, ge=1, description="characters of a regex grammar"
    )
    max_grammar_ebnf_chars: int = Field(
        _GRAMMAR.max_grammar_ebnf_chars, ge=1, description="characters of an EBNF grammar"
    )
    num_cpus_per_rank: float = Field(1.0, gt=0, description="CPUs Ray reserves per rank")
    num_gpus_per_rank: float = Field(
        0.0,
        ge=0,
        description="GPUs Ray reserves per rank (a rank given none sees none; roundgate "
        "serve's --device cuda sets 1 when neither the config nor a flag sets it)",
    )
    resources_per_rank: dict[str, float] = Field(
        default_factory=dict,
        description="Ray custom resources each rank needs (a node label such as "
        "{node_a: 0.1} places ranks on the nodes that offer it)",
    )
    gang_placement: Literal["pack", "spread"] = Field(
        "pack",
        description="where a group's ranks go: pack (as few nodes as fit, NVLink-close) or "
        "spread (one rank a node where possible: a node's loss costs each group one rank)",
    )
    max_ongoing_requests: int = Field(
        1024, ge=1, description="requests one replica (ingress or rank) holds at once"
    )
    ingress_replicas: int = Field(1, ge=1, description="OpenAI front-door replicas")
    max_queued_requests: int = Field(
        -1,
        ge=-1,
        description="requests each HTTP proxy queues for the ingress once every ingress "
        "replica holds max_ongoing_requests; past it a request is a 503 at once (Serve's "
        "backpressure). -1: no limit",
    )
    max_background_responses: int = Field(
        100,
        ge=1,
        description="Responses API background responses one ingress replica runs at once; "
        "past it a background request is a 429 naming this limit",
    )
    background_timeout_s: float = Field(
        3600.0,
        gt=0,
        description="a background response still running after this is failed (code "
        "background_timeout) and its rank request cancelled",
    )
    ingress_resources: dict[str, float] = Field(
        default_factory=dict,
        description="Ray custom resources each ingress replica needs (e.g. {head: 0.01} keeps "
        "the OpenAI front door, and its streams, off nodes that may be lost)",
    )
    elastic_dp: bool = Field(
        False,
        description="rank replicas outside a gang: a dead or hung rank costs only itself (its "
        "group re-forms around it, its replacement joins at a round boundary); dense and MoE "
        "models, fused deployments and each P/D role (docs/fault-tolerance.md)",
    )
    autoscaling: GroupAutoscaling | None = Field(
        None, description="Serve autoscaling in whole groups (``deployment/autoscaling.py``)"
    )
    # P/D disaggregation (``deployment/pd_config.py``): both sections, or neither (fused).
    prefill: RoleArgs | None = None
    decode: RoleArgs | None = None
    _server_args: ServerArgs | None = PrivateAttr(default=None)
    _role_args: dict[str, ServerArgs] = PrivateAttr(default_factory=dict)
    _role_routers: dict[str, str] = PrivateAttr(default_factory=dict)  # P/D: role -> router

    @classmethod
    def of(cls, value: AppArgs | dict[str, Any]) -> AppArgs:
        """``value`` itself when it is an ``AppArgs`` (validated already, in this process or
        before it was pickled to this one), else validated from a dict (a serve config's
        ``args``): a deployment validates once, where ``build_app`` is called."""
        return value if isinstance(value, AppArgs) else cls.model_validate(value)

    @model_validator(mode="before")
    @classmethod
    def _split_engine_fields(cls, data: Any) -> Any:
        """Accept engine flags at the top level (as a flat ``serve run`` args dict)."""
        if not isinstance(data, dict):
            return data
        data = dict(data)
        engine = dict(data.pop("engine", None) or {})
        for name in engine_arg_names():
            if name in data:
                engine[name] = data.pop(name)
        data["engine"] = engine
        for role in ROLES:
            if role in data:
                data[role] = split_role(role, data[role])
        return data

    @model_validator(mode="after")
    def _check(self) -> AppArgs:
        unknown = sorted(set(self.engine) - set(engine_arg_names()))
        if unknown:
            raise ValueError(f"unknown engine argument(s) {unknown}")
        try:
            args = ServerArgs(**self.engine)  # its refusals name the flag
        except TypeError as exc:
            raise ValueError(f"bad engine arguments: {exc}") from exc
        self._server_args = args
        if self.max_queued_requests == 0:
            raise ValueError(
                "max_queued_requests must be -1 (no limit) or >= 1; 0 would refuse every "
                "request that waits"
            )
        _check_resources("resources_per_rank", self.resources_per_rank)
        _check_resources("ingress_resources", self.ingress_resources)
        if self.autoscaling is not None:
            self._check_autoscaling(args.dp_size)
        if self.prefill is not None or self.decode is not None:
            self._check_pd()
        # Under P/D each role's router reads its settings (the prefill one takes the prompts
        # and their sessions); a setting no router reads is refused by name.
        routers = tuple(self._role_routers.values()) if self.is_pd else (self.router,)
        registry.check(routers, self.router_values(), args.dp_size, "serve", key)
        if not self.is_pd:
            registry.check_prefill_policy(self.router, args.prefill_policy_name, key)
        return self

    def _check_pd(self) -> None:
        """Both role sections, validated together; the fused-only app args refused by name."""
        missing = [role for role in ROLES if getattr(self, role) is None]
        if missing:
            raise ValueError(f"a P/D deployment needs both role sections; {missing[0]} is missing")
        fused_only = {"num_groups": 1, "route_weights": None}
        for name in sorted(self.model_fields_set & set(fused_only)):
            if getattr(self, name) != fused_only[name]:
                raise ValueError(
                    f"{name} applies to a fused deployment only: P/D serves one group per role"
                )
        given = self.router if "router" in self.model_fields_set else None
        self._role_routers = registry.pd_role_routers(given, key)
        roles = {role: getattr(self, role) for role in ROLES}
        for role, section in roles.items():
            _check_resources(f"{role}.resources_per_rank", section.resources_per_rank or {})
        self._role_args = role_server_args(self.engine, roles)

    @property
    def is_pd(self) -> bool:
        """Whether this is a P/D deployment (a prefill and a decode group)."""
        return bool(self._role_args)

    def role_args(self, role: str) -> ServerArgs:
        """A P/D role's ``ServerArgs`` (shared flags, the section's, its mode)."""
        return self._role_args[role]

    def role_resources(self, role: str) -> tuple[float, float, dict[str, float]]:
        """A P/D role's CPUs, GPUs and custom resources per rank (the section's, else the
        shared ones)."""
        section = getattr(self, role)
        cpus = section.num_cpus_per_rank
        gpus = section.num_gpus_per_rank
        custom = section.resources_per_rank
        return (
            self.num_cpus_per_rank if cpus is None else cpus,
            self.num_gpus_per_rank if gpus is None else gpus,
            self.resources_per_rank if custom is None else custom,
        )

    def _check_autoscaling(self, dp_size: int) -> None:
        if self.elastic_dp:
            raise ValueError(
                "autoscaling scales whole gangs and elastic_dp ranks are single replicas (a "
                "group short of a rank is elastic DP's to heal): set elastic_dp: false, or "
                "drop autoscaling and size num_groups"
            )
        if self.prefill is not None or self.decode is not None:
            raise ValueError("autoscaling applies to a fused deployment only, not to P/D roles")
        self.replica_options(dp_size)  # num_groups within the range

    def replica_options(self, dp_size: int) -> dict[str, Any]:
        """The rank deployment's replica count: fixed, or Serve's autoscaling in groups."""
        if self.autoscaling is None:
            return {"num_replicas": self.num_groups * dp_size}
        return self.autoscaling.serve_options(self.num_groups, dp_size)

    @staticmethod
    def rank_actor_options(cpus: float, gpus: float, custom: dict[str, float]) -> dict[str, Any]:
        """A rank replica's ``ray_actor_options``."""
        options: dict[str, Any] = {"num_cpus": cpus, "num_gpus": gpus}
        if custom:
            options["resources"] = dict(custom)
        return options

    def placement(self, dp_size: int, elastic: bool) -> dict[str, Any]:
        """The rank deployment's placement options for ``gang_placement``.

        A gang takes Serve's gang strategy (PACK or SPREAD over the gang's bundles). Elastic
        ranks are plain replicas with no per-group placement in Serve, so ``spread`` caps each
        node at ``num_groups`` rank replicas: with one group no two ranks share a node (a
        node's loss costs it one rank, and its replacement waits for a node); with more, a
        node holds at most ``num_groups`` ranks, not necessarily of different groups.
        """
        from ray.serve.config import GangPlacementStrategy, GangSchedulingConfig

        if elastic:
            return (
                {"max_replicas_per_node": self.num_groups}
                if self.gang_placement == "spread"
                else {}
            )
        strategy = (
            GangPlacementStrategy.SPREAD
            if self.gang_placement == "spread"
            else GangPlacementStrategy.PACK
        )
        return {
            "gang_scheduling_config": GangSchedulingConfig(
                gang_size=dp_size, gang_placement_strategy=strategy
            )
        }

    def server_args(self) -> ServerArgs:
        """The engine flags as the one ``ServerArgs`` built when this model was validated."""
        assert self._server_args is not None  # set by the validator
        return self._server_args

    @property
    def resolved_api_keys(self) -> tuple[str, ...]:
        """The keys a request may present (none: no key needed); empty strings are no keys."""
        given = self.api_key or os.environ.get("ROUNDGATE_API_KEY") or ()
        keys = (given,) if isinstance(given, str) else tuple(given)
        return tuple(k for k in keys if k)

    @property
    def served_model_name(self) -> str:
        return self.model_name or os.path.basename(str(self.engine.get("model", "tiny-moe")))

    def ingress_args(self) -> dict[str, Any]:
        """These args as a dict the ingress replica would validate again: only what was
        given, so a default is not read as a choice there (a P/D deployment refuses an
        explicit fused router, and ``router``'s default is one). Binding the ``AppArgs``
        itself (``AppArgs.of`` on the other side) validates nothing again."""
        return self.model_dump(exclude_unset=True)

    def router_values(self) -> dict[str, Any]:
        """Every router setting's value, by name (the serve config's router keys)."""
        return {option.name: getattr(self, option.name) for option in registry.options("serve")}

    def router_kwargs(self) -> dict[str, Any]:
        """The request router's own arguments (weights, or its policy's config)."""
        return self._router_kwargs(self.router, self.server_args())

    def _router_kwargs(self, router: str, engine: ServerArgs) -> dict[str, Any]:
        """``router``'s arguments for ranks running ``engine`` (their pool and page size)."""
        return registry.arguments(router, self.router_values(), engine)

    def pd_router(self, role: str) -> str:
        """A P/D role's Serve router (its router's ``pd_roles``, ``roundgate.routing.registry``)."""
        return self._role_routers[role]

    def pd_router_kwargs(self, role: str) -> dict[str, Any]:
        """A P/D role's router arguments, sized by that role's pool (the shared thresholds and
        weights): the prefill rank with the fewest uncached tokens (cache-aware's guess or
        kv-aware's reported pools), the decode rank with the least load."""
        return self._router_kwargs(self.pd_router(role), self.role_args(role))

    def rank_args(self, role: str | None = None) -> ServerArgs:
        """The ``ServerArgs`` a rank replica is bound with (fused: ``role`` None; P/D: its
        role's), with ``publish_kv_events`` on when a kv router reads what the ranks hold. The
        object itself crosses to the rank's process (``ServerArgs.of`` there: no validation)."""
        engine = self.server_args() if role is None else self.role_args(role)
        if self.publishes_kv_events and not engine.publish_kv_events:
            engine = engine.replace(publish_kv_events=True)
        return engine

    def rank_flags(self, role: str | None = None) -> dict[str, Any]:
        """``rank_args`` as a flat dict (what a rank replica validates again)."""
        return self.rank_args(role).to_dict()

    @property
    def publishes_kv_events(self) -> bool:
        """Whether the ranks send their KV events and loads to the hub (a kv router reads
        them: fused kv-aware or gate-aware, or P/D kv-aware's roles)."""
        routers = self._role_routers.values() if self.is_pd else (self.router,)
        return any(registry.entry(r).reads_kv_events for r in routers)


def _check_resources(name: str, resources: dict[str, float]) -> None:
    """Custom resources only (CPUs and GPUs have their own keys), each a positive amount."""
    for resource, amount in resources.items():
        if resource in ("CPU", "GPU", "memory", "object_store_memory"):
            raise ValueError(
                f"{name}: {resource!r} is not a custom resource (CPUs and GPUs have their "
                "own settings, e.g. num_cpus_per_rank / num_gpus_per_rank)"
            )
        if not amount > 0:
            raise ValueError(f"{name}: {resource!r} must be > 0, got {amount}")
