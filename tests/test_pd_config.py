"""P/D deployment args: shared settings once, a section per role, validated together; each
refusal names the culprit (the role and the flag)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from roundgate.deployment.config import AppArgs

REPO = Path(__file__).resolve().parents[1]


def pd_args(**changes: Any) -> dict[str, Any]:
    """Small valid P/D args (tiny preset); ``prefill``/``decode`` changes merge into the
    section, ``None`` drops a key."""
    args: dict[str, Any] = {
        "model": "tiny-llama",
        "page_size": 16,
        "max_model_len": 256,
        "device": "cpu",
        "prefill": {"dp_size": 1, "num_kv_pages": 64, "num_cpus_per_rank": 0.5},
        "decode": {"dp_size": 2, "max_num_seqs": 8, "num_kv_pages": 32},
    }
    for key, value in changes.items():
        if value is None:
            args.pop(key, None)
        elif key in ("prefill", "decode") and isinstance(value, dict):
            args[key] = {**args[key], **value}
        else:
            args[key] = value
    return args


def test_each_role_gets_the_shared_flags_its_section_and_its_mode() -> None:
    cfg = AppArgs.model_validate(pd_args())
    prefill, decode = cfg.role_args("prefill"), cfg.role_args("decode")
    assert cfg.is_pd and not AppArgs.model_validate({"model": "tiny-llama"}).is_pd
    assert (prefill.disaggregation_mode, decode.disaggregation_mode) == ("prefill", "decode")
    assert (prefill.dp_size, decode.dp_size, decode.max_num_seqs) == (1, 2, 8)
    assert prefill.model == decode.model == "tiny-llama" and prefill.max_model_len == 256
    assert cfg.role_resources("prefill") == (0.5, 0.0, {})
    assert cfg.role_resources("decode") == (cfg.num_cpus_per_rank, 0.0, {})  # the shared default
    assert cfg.pd_router_kwargs("prefill")["max_pages_per_rank"] == 64


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (  # gate flags, shared or in a section
            {"prefill_attempt_interval": 4, "prefill_any_attempt_interval": 16},
            "prefill_any_attempt_interval: a P/D deployment runs no prefill gate",
        ),
        (
            {"decode": {"prefill_decode_interval": 2}},
            "decode.prefill_decode_interval: a P/D deployment runs no prefill gate",
        ),
        ({"prefill": {"prefill_policy": "none"}}, "prefill.prefill_policy: a P/D deployment"),
        (  # a decode pool that cannot hold one full-length request
            {"decode": {"num_kv_pages": 15}},
            "decode.num_kv_pages 15 holds 240 tokens, less than one request of max_model_len 256",
        ),
        ({"prefill": {"num_kv_pages": 3}}, "prefill.num_kv_pages 3 holds 48 tokens"),
        (  # the roles must serve one model
            {"decode": {"model": "tiny-moe"}},
            "prefill.model 'tiny-llama' and decode.model 'tiny-moe' differ",
        ),
        ({"decode": {"page_size": 32}}, "prefill.page_size 16 and decode.page_size 32 differ"),
        ({"prefill": None}, "needs both role sections; prefill is missing"),
        ({"prefill": {"dp_sise": 1}}, "prefill.dp_sise: not an engine flag or a role resource"),
        ({"decode": {"disaggregation_mode": "prefill"}}, "decode.disaggregation_mode"),
        ({"disaggregation_mode": "decode"}, "disaggregation_mode: a P/D deployment sets"),
        ({"router": "least-loaded"}, "router .least-loaded.: a P/D deployment routes with"),
        ({"num_groups": 2}, "num_groups applies to a fused deployment only"),
        ({"decode": {"dp_size": 9}}, "decode role: --max-num-seqs (8) must be >= --dp-size (9)"),
    ],
)
def test_refusals_name_the_culprit(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message.replace("(", r"\(").replace(")", r"\)")):
        AppArgs.model_validate(pd_args(**changes))


def test_each_role_may_be_elastic() -> None:
    """``elastic_dp`` on a P/D deployment: each role an elastic group of its own."""
    cfg = AppArgs.model_validate(pd_args(elastic_dp=True, decode={"dp_size": 2}))
    assert cfg.elastic_dp and cfg.is_pd
    assert cfg.placement(2, cfg.elastic_dp) == {}  # plain replicas, no gang


@pytest.mark.parametrize("name", ["pd.yaml", "local.yaml", "local-dp1.yaml"])
def test_the_ingress_validates_the_shipped_configs_again_to_the_same_args(name: str) -> None:
    """build_app hands the ingress replica its args to validate again; pd.yaml once failed
    there (the fused ``router`` default read as a choice P/D refuses) and never deployed."""
    config = yaml.safe_load((REPO / "deployment" / "configs" / name).read_text())
    cfg = AppArgs.model_validate(config["applications"][0]["args"])
    again = AppArgs.model_validate(cfg.ingress_args())
    assert again.model_dump() == cfg.model_dump()
    assert again.is_pd == cfg.is_pd == (name == "pd.yaml")


def test_pd_yaml_is_one_prefill_and_one_decode_rank_of_the_default_model() -> None:
    config = yaml.safe_load((REPO / "deployment" / "configs" / "pd.yaml").read_text())
    (app,) = config["applications"]
    local = yaml.safe_load((REPO / "deployment" / "configs" / "local.yaml").read_text())
    cfg = AppArgs.model_validate(app["args"])
    assert cfg.role_args("prefill").dp_size == cfg.role_args("decode").dp_size == 1
    assert cfg.role_args("decode").model == local["applications"][0]["args"]["model"]
