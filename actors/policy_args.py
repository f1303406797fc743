"""``--prefill-policy`` and each policy's own flags: resolution, validation, construction.

Kept beside ``ServerArgs`` (which calls ``validate_policy_args``) so the flag rules of the six
policies live in one table instead of spreading through the engine's config.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gate.policy import POLICIES, PrefillPolicy, build_policy
from gate.sglang_delayer import SGLangDelayerConfig
from gate.trtllm_balance import TrtllmBalanceConfig

if TYPE_CHECKING:
    from actors.server_args import ServerArgs

# ServerArgs fields that belong to one policy only; None means "unset, use the peer default".
POLICY_FIELDS: dict[str, tuple[str, ...]] = {
    "sglang-delayer": (
        "prefill_delayer_max_delay_passes",
        "prefill_delayer_token_usage_low_watermark",
        "prefill_delayer_queue_min_ratio",
        "prefill_delayer_max_delay_ms",
        "prefill_delayer_prefill_max_requests",
    ),
    "vllm-interval": ("prefill_schedule_interval",),
    "trtllm-balance": ("attention_dp_timeout_iters", "attention_dp_batching_wait_iters"),
}
INT_FIELDS = (
    "prefill_delayer_max_delay_passes",
    "prefill_delayer_prefill_max_requests",
    "prefill_schedule_interval",
    "attention_dp_timeout_iters",
    "attention_dp_batching_wait_iters",
)


def _cli(name: str) -> str:
    return "--" + name.replace("_", "-")


def resolved_policy(args: ServerArgs) -> str:
    """``--prefill-policy`` if given; else derived as before the flag existed: the gate when
    its intervals are set, the local interval when it is > 0, otherwise no policy."""
    if args.prefill_policy is not None:
        return args.prefill_policy
    if args.prefill_attempt_interval is not None or args.prefill_any_attempt_interval is not None:
        return "roundgate"
    if args.prefill_decode_interval:
        return "local-interval"
    return "none"


def validate_policy_args(args: ServerArgs) -> None:
    """Refuse an unknown policy, a policy missing its settings, and flags of another policy."""
    if args.prefill_policy is not None and args.prefill_policy not in POLICIES:
        raise ValueError(
            f"--prefill-policy must be one of {', '.join(POLICIES)}, got {args.prefill_policy!r}"
        )
    policy = resolved_policy(args)
    for name in INT_FIELDS:
        value = getattr(args, name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise ValueError(f"{_cli(name)} must be an integer, got {value!r}")
    foreign = [
        ("prefill_attempt_interval", "roundgate"),
        ("prefill_any_attempt_interval", "roundgate"),
    ]
    foreign += [(n, p) for p, names in POLICY_FIELDS.items() for n in names]
    for name, owner in foreign:
        if getattr(args, name) is not None and owner != policy:
            raise ValueError(
                f"{_cli(name)} applies to --prefill-policy {owner} only (selected: {policy})"
            )
    if args.prefill_decode_interval and policy != "local-interval":
        raise ValueError(
            f"--prefill-decode-interval applies to --prefill-policy local-interval only "
            f"(selected: {policy})"
        )
    # Build once on rank 0: each policy's config refuses bad values naming its flag.
    build_policy_for(args, 0)


def sglang_config(args: ServerArgs) -> SGLangDelayerConfig:
    """SGLang's delayer settings; unset flags keep SGLang's defaults."""
    given = {
        name.removeprefix("prefill_delayer_"): getattr(args, name)
        for name in POLICY_FIELDS["sglang-delayer"]
        if getattr(args, name) is not None
    }
    return SGLangDelayerConfig(max_running_requests=args.max_batch_size, **given)


def trtllm_config(args: ServerArgs) -> TrtllmBalanceConfig:
    """TRT-LLM's balance settings; unset flags keep TRT-LLM's defaults."""
    given = {
        name.removeprefix("attention_dp_"): getattr(args, name)
        for name in POLICY_FIELDS["trtllm-balance"]
        if getattr(args, name) is not None
    }
    return TrtllmBalanceConfig(max_batch_size=args.max_batch_size, **given)


def build_policy_for(args: ServerArgs, rank: int) -> PrefillPolicy:
    """The policy ``args`` select, for one rank of the group."""
    policy = resolved_policy(args)
    return build_policy(
        policy,
        rank,
        delay=args.prefill_delay,
        prefill_decode_interval=args.prefill_decode_interval,
        sglang=sglang_config(args) if policy == "sglang-delayer" else None,
        prefill_schedule_interval=(
            1 if args.prefill_schedule_interval is None else args.prefill_schedule_interval
        ),
        trtllm=trtllm_config(args) if policy == "trtllm-balance" else None,
    )
