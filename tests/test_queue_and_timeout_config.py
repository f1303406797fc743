"""``max_queued_requests`` and ``http_options.request_timeout_s``: the shipped configs carry
them, they reach Serve, and a bad value is refused naming its key."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from roundgate.deployment.config import AppArgs
from roundgate.deployment.local import http_options, load_config

CONFIGS = Path(__file__).resolve().parents[1] / "deployment" / "configs"
TINY = {"model": "tiny-moe", "dp_size": 2, "device": "cpu"}


@pytest.mark.parametrize("name", ["local.yaml", "local-dp1.yaml", "pd.yaml", "gpu.yaml"])
def test_every_shipped_config_bounds_its_queue_and_its_requests(name: str) -> None:
    cfg = yaml.safe_load((CONFIGS / name).read_text())
    args = cfg["applications"][0]["args"]
    assert args["max_queued_requests"] >= 1
    assert http_options(cfg)["request_timeout_s"] > 0


def test_the_queue_bound_reaches_the_ingress_deployment() -> None:
    from roundgate.deployment.app import build_app

    ingress = build_app({**TINY, "max_queued_requests": 7})._bound_deployment
    assert (ingress.name, ingress._deployment_config.max_queued_requests) == ("OpenAIServer", 7)
    assert AppArgs.of(TINY).max_queued_requests == -1  # unset: Serve's own (no limit)


@pytest.mark.parametrize("value", [0, -2, "many"])
def test_a_bad_queue_bound_is_refused_by_name(value: Any) -> None:
    with pytest.raises(ValueError, match="max_queued_requests"):
        AppArgs.of({**TINY, "max_queued_requests": value})


@pytest.mark.parametrize("value", [0, -5, "soon", True])
def test_a_bad_request_timeout_is_refused_by_name(value: Any, tmp_path: Path) -> None:
    cfg = yaml.safe_load((CONFIGS / "local.yaml").read_text())
    cfg["http_options"]["request_timeout_s"] = value
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(cfg))
    with pytest.raises(ValueError, match=r"http_options\.request_timeout_s"):
        load_config(path)


def test_http_options_round_trip() -> None:
    cfg = {"http_options": {"host": "0.0.0.0", "port": "9000", "request_timeout_s": 30}}
    assert http_options(cfg) == {"host": "0.0.0.0", "port": 9000, "request_timeout_s": 30.0}
    assert http_options({}) == {"host": "127.0.0.1", "port": 8000}  # no timeout unless set
