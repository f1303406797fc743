"""``roundgate serve [MODEL] [flags]``: every engine and app flag, overriding the config file.

No Ray: the flags are parsed, merged into the loaded config (``apply_overrides``) and validated
(``app_args``), which is everything ``serve_forever`` does before a cluster starts.
"""

from __future__ import annotations

import pickle
import re
from pathlib import Path
from typing import Any

import pytest

from roundgate.actors.model.runner_config import RunnerConfig
from roundgate.actors.server_args import ServerArgs, engine_arg_names, flag_name
from roundgate.cli import serve
from roundgate.cli.main import build_parser, main
from roundgate.deployment.config import AppArgs
from roundgate.deployment.local import DEFAULT_CONFIG, app_args, apply_overrides, load_config

REPO = Path(__file__).resolve().parents[1]
APP_FLAGS = [f"--{n.replace('_', '-')}" for n in AppArgs.model_fields if n not in serve.CONFIG_ONLY]
LOCAL = load_config(DEFAULT_CONFIG)


def serve_help(capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as exit_info:
        main(["serve", "--help"])
    assert exit_info.value.code == 0
    return capsys.readouterr().out


def given(*argv: str) -> dict[str, Any]:
    """The overrides ``roundgate serve ARGV`` passes to ``serve_forever``."""
    return serve.overrides(build_parser().parse_args(["serve", *argv]))


def deployed(*argv: str) -> dict[str, Any]:
    """The args ``roundgate serve ARGV`` deploys: local.yaml's, the flags merged in."""
    return apply_overrides(LOCAL, given(*argv))["applications"][0]["args"]


# --- the flags: every one, derived ------------------------------------------------------------


def test_help_lists_the_engine_and_app_flags(capsys: pytest.CaptureFixture[str]) -> None:
    text = serve_help(capsys)
    for flag in ("--dp-size", "--api-key", "--prefill-policy", "--device", "--ingress-replicas"):
        assert flag in text
    assert "MODEL" in text and "--config" in text and "--address" in text


def test_every_engine_and_app_flag_is_a_serve_flag(capsys: pytest.CaptureFixture[str]) -> None:
    listed = set(re.findall(r"--[a-z0-9-]+", serve_help(capsys)))
    engine = {flag_name(name) for name in engine_arg_names()}
    assert engine | set(APP_FLAGS) <= listed


def test_docs_cli_holds_the_flag_tables_as_generated() -> None:
    """docs/cli.md's tables are ``flag_reference()``'s output: a flag added to ServerArgs, a
    policy or AppArgs, or a changed help, is one ``python -m roundgate.cli.serve`` away."""
    text = (REPO / "docs" / "cli.md").read_text()
    begin, end = text.index(serve.REFERENCE_BEGIN), text.index(serve.REFERENCE_END)
    block = text[begin + len(serve.REFERENCE_BEGIN) : end].strip()
    assert block == serve.flag_reference().strip(), "regenerate: python -m roundgate.cli.serve"


# --- overrides land in the deployed config ------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        ([], {}),
        (["--dp-size", "4"], {"dp_size": 4}),
        (["my-model-dir"], {"model": "my-model-dir"}),
        (["--model", "tiny-llama"], {"model": "tiny-llama"}),
        (["--api-key", "k1"], {"api_key": "k1"}),
        (["--api-key", "k1", "--api-key", "k2"], {"api_key": ["k1", "k2"]}),
        (
            ["--ingress-replicas", "2", "--no-elastic-dp"],
            {"ingress_replicas": 2, "elastic_dp": False},
        ),
        (["--route-weights", "8,1"], {"route_weights": [8, 1]}),
        (["--resources-per-rank", '{"node_a": 0.1}'], {"resources_per_rank": {"node_a": 0.1}}),
        (["--enable-mixed-prefill-decode"], {"enable_mixed_prefill_decode": True}),
        (["--prefill-attempt-interval", "2"], {"prefill_attempt_interval": 2}),
    ],
)
def test_only_the_flags_given_are_overrides(argv: list[str], expected: dict[str, Any]) -> None:
    assert given(*argv) == expected
    args = deployed(*argv)
    base = LOCAL["applications"][0]["args"]
    assert args == base | expected


def test_overrides_leave_the_loaded_config_as_it_was() -> None:
    before = repr(LOCAL)
    deployed("--dp-size", "4", "--prefill-policy", "none")
    assert repr(LOCAL) == before


@pytest.mark.parametrize(
    ("argv", "dropped", "policy"),
    [
        # local.yaml runs the gate: naming another policy drops the gate's intervals
        (["--prefill-policy", "none"], {"prefill_attempt_interval"}, "none"),
        (
            ["--prefill-policy", "roundgate-auto"],
            {"prefill_any_attempt_interval"},
            "roundgate-auto",
        ),
        # ... and so does giving another policy's flags (which imply it)
        (["--prefill-decode-interval", "4"], {"prefill_attempt_interval"}, "local-interval"),
        # the gate's own flags keep the gate
        (["--prefill-attempt-interval", "2"], set(), "roundgate"),
    ],
)
def test_a_policy_flag_replaces_the_config_files_policy(
    argv: list[str], dropped: set[str], policy: str
) -> None:
    args = deployed(*argv)
    assert not dropped & set(args)
    assert app_args(LOCAL, given(*argv)).server_args().prefill_policy_name == policy


@pytest.mark.parametrize(
    ("argv", "gpus"),
    [
        (["--device", "cuda"], 1),  # a rank Ray gives no GPU sees none
        (["--device", "cuda", "--num-gpus-per-rank", "0.5"], 0.5),
        (["--device", "cpu"], None),
    ],
)
def test_cuda_reserves_a_gpu_per_rank_unless_told(argv: list[str], gpus: float | None) -> None:
    assert deployed(*argv).get("num_gpus_per_rank") == gpus


def test_the_validated_overrides_are_what_is_deployed() -> None:
    overrides = given(
        "--dp-size", "4", "--max-num-seqs", "8", "--api-key", "k", "--num-groups", "2"
    )
    cfg = app_args(LOCAL, overrides)
    assert (cfg.server_args().dp_size, cfg.server_args().max_num_seqs) == (4, 8)
    assert (cfg.resolved_api_keys, cfg.num_groups) == (("k",), 2)
    assert AppArgs.of(cfg) is cfg  # build_app takes the object as it is


# --- refusals name the flag ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--dp-size", "x"], "argument --dp-size: invalid int value"),
        (["--device", "gpu"], "argument --device: invalid choice"),
        (["--prefill-policy", "fastest"], "argument --prefill-policy: invalid choice"),
        (["--route-weights", "8,a"], "argument --route-weights"),
        (["--resources-per-rank", "{"], "argument --resources-per-rank: not JSON"),
        (["--no-such-flag"], "unrecognized arguments: --no-such-flag"),
        # refused once parsed, by the validation the deployment runs (before any cluster)
        (["--dp-size", "0"], "--dp-size must be a positive integer, got 0"),
        (["--max-num-seqs", "1", "--dp-size", "2"], "--max-num-seqs (1) must be >= --dp-size"),
        (["--ingress-replicas", "0"], "--ingress-replicas: Input should be greater than"),
        (["--model", "no/such/dir"], "--model 'no/such/dir' is neither a preset"),
        (["tiny-llama", "--model", "tiny-moe"], "MODEL tiny-llama and --model tiny-moe differ"),
    ],
)
def test_a_bad_flag_is_an_argparse_error_naming_it(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["serve", *argv])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "error:" in err and message in err, err


# --- the validated object crosses process boundaries as itself -----------------------------------


def test_validated_app_args_pickle_without_validating_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cfg = app_args(LOCAL, {"api_key": "k"})

    def refuse(*_: Any, **__: Any) -> None:
        raise AssertionError("validated again")

    monkeypatch.setattr(ServerArgs, "_validate", refuse)
    back = pickle.loads(pickle.dumps(cfg))
    assert back.server_args() == cfg.server_args()
    assert back.resolved_api_keys == ("k",)
    assert ServerArgs.of(back.rank_args()) is back.rank_args()


def test_the_runner_config_is_the_runners_part_of_the_args() -> None:
    args = ServerArgs(model="tiny-llama", dp_size=2, max_num_seqs=8, num_kv_pages=32)
    config = RunnerConfig.of(args)
    assert (config.model, config.max_batch_size, config.num_kv_pages) == ("tiny-llama", 4, 32)
    assert config.model_config is args.model_config
    sized = config.with_pages(7)
    assert (sized.num_kv_pages, sized.gpu_memory_utilization, config.num_kv_pages) == (7, None, 32)
