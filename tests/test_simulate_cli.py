"""``roundgate simulate`` through ``roundgate.cli.main.main``: outputs, and bad input as a one-line
error that names the flag (exit code 2)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from roundgate.cli.main import build_parser, main
from roundgate.gate import registry
from roundgate.gate.delay import PrefillDelay
from roundgate.gate.local_interval import LocalIntervalConfig
from roundgate.gate.no_gate import NoGateConfig
from roundgate.gate.sglang_delayer import SGLangDelayerConfig
from roundgate.gate.trtllm_balance import TrtllmBalanceConfig
from roundgate.gate.vllm_interval import VllmIntervalConfig
from roundgate.sim.options import sim_specs

# A small, fast run: 2 ranks, 24 short requests.
BASE = [
    "simulate",
    "--dp-size", "2",
    "--max-num-seqs", "16",
    "--num-kv-pages", "64",
    "--page-size", "16",
    "--num-requests", "24",
    "--rate", "50",
    "--input-len", "64",
    "--output-len", "6",
    "--no-progress",
]  # fmt: skip


def simulate(*extra: str) -> int:
    return main([*BASE, *extra])


def run_json(tmp_path: Path, name: str, *extra: str) -> dict:
    path = tmp_path / name
    assert simulate("--json", str(path), *extra) == 0
    return json.loads(path.read_text())


# --- good runs ----------------------------------------------------------------------------------


def test_json_report_has_config_and_results(tmp_path: Path, capsys) -> None:
    report = run_json(tmp_path, "out.json")
    (result,) = report["results"]
    assert result["policy"] == "roundgate" and result["unfinished"] == 0
    assert report["config"]["dp_size"] == 2
    assert set(report["config"]["resolved_costs"]) >= {"decode_base_ms", "extend_overhead_ms"}
    table = capsys.readouterr().out
    assert table.splitlines()[0].startswith("policy") and "roundgate" in table


@pytest.mark.parametrize(
    "extra",
    [
        (),
        ("--compare", "all"),
        ("--router", "skewed", "--route-weights", "3,1", "--arrival", "bursty"),
        ("--length-dist", "exponential", "--enable-mixed-prefill-decode"),
    ],
)
def test_same_seed_same_json(tmp_path: Path, extra: tuple[str, ...]) -> None:
    first = run_json(tmp_path, "a.json", "--seed", "5", *extra)
    second = run_json(tmp_path, "b.json", "--seed", "5", *extra)
    assert json.dumps(first["results"], sort_keys=True) == json.dumps(
        second["results"], sort_keys=True
    )
    first["config"].pop("json")
    second["config"].pop("json")
    assert first["config"] == second["config"]


def test_compare_runs_each_policy_on_one_workload(tmp_path: Path) -> None:
    report = run_json(tmp_path, "cmp.json", "--compare", "all")
    results = report["results"]
    assert [r["policy"] for r in results] == list(registry.names())
    assert set(report["ratios_to_none"]) == set(registry.names())
    # Same workload: same requests and the same total output for every policy.
    assert len({(r["requests"], r["output_tokens"]) for r in results}) == 1


# Each policy's config when simulate is given none of its flags (the "sim_default"s).
SIM_CONFIGS = {
    "roundgate": PrefillDelay(4, 16),
    "none": NoGateConfig(),
    "local-interval": LocalIntervalConfig(4),
    "sglang-delayer": SGLangDelayerConfig(),
    "vllm-interval": VllmIntervalConfig(2),
    "trtllm-balance": TrtllmBalanceConfig(),
}


@pytest.mark.parametrize(
    ("extra", "changed"),
    [
        ((), {}),
        (("--prefill-decode-interval", "7"), {"local-interval": LocalIntervalConfig(7)}),
        (
            ("--prefill-attempt-interval", "2", "--prefill-schedule-interval", "3"),
            {"roundgate": PrefillDelay(2, 16), "vllm-interval": VllmIntervalConfig(3)},
        ),
        (
            ("--attention-dp-timeout-iters", "9"),
            {"trtllm-balance": TrtllmBalanceConfig(timeout_iters=9)},
        ),
    ],
)
def test_each_policy_runs_with_its_simulate_defaults_and_only_its_own_flags(
    extra: tuple[str, ...], changed: dict
) -> None:
    ns = build_parser().parse_args([*BASE, "--compare", "all", *extra])
    specs = sim_specs(ns)
    assert [spec.policy for spec in specs] == list(registry.names())
    args_of = {spec.policy: spec.args for spec in specs}
    configs = {name: args_of[name].policy_config for name in SIM_CONFIGS}
    assert configs == SIM_CONFIGS | changed
    # One workload, drawn once, for every policy.
    assert len({id(spec.workload) for spec in specs}) == 1
    for name, args in args_of.items():
        assert args.prefill_policy_name == name
        # A policy's run carries its own flags only: another's flag would be refused.
        assert all(registry.all_flags()[flag][1] == name for flag in args.policy_flags)


def test_simulate_has_a_flag_for_every_policy_flag(capsys) -> None:
    with pytest.raises(SystemExit):
        main(["simulate", "--help"])
    out = capsys.readouterr().out
    for flag, _owner in registry.all_flags().values():
        assert flag.cli in out


def test_trace_arrivals_and_cost_file(tmp_path: Path) -> None:
    trace = tmp_path / "trace.jsonl"
    trace.write_text(
        "\n".join(
            json.dumps(
                {"time_s": t / 10, "prompt_tokens": 20 + t, "output_tokens": 3, "rank": t % 2}
            )
            for t in range(6)
        )
    )
    costs = tmp_path / "costs.json"
    costs.write_text(json.dumps({"base": "h100-dsv3", "extend_overhead_ms": 5.0}))
    report = run_json(
        tmp_path, "t.json", "--arrival", "trace", "--trace", str(trace), "--costs", str(costs)
    )
    (result,) = report["results"]
    assert result["requests"] == 6 and result["output_tokens"] == 18
    assert report["config"]["resolved_costs"]["extend_overhead_ms"] == 5.0
    assert report["config"]["resolved_costs"]["decode_base_ms"] == 30.0


def test_cost_flag_overrides_the_preset(tmp_path: Path) -> None:
    report = run_json(tmp_path, "c.json", "--costs", "toy", "--gather-ms", "0.5")
    assert report["config"]["resolved_costs"]["gather_ms"] == 0.5


def test_plots_are_written(tmp_path: Path, capsys) -> None:
    assert simulate("--compare", "roundgate,none", "--plot", str(tmp_path / "plots")) == 0
    names = sorted(p.name for p in (tmp_path / "plots").iterdir())
    assert names == [
        "itl_cdf.png",
        "ratios.png",
        "timeline_none.png",
        "timeline_roundgate.png",
        "ttft_cdf.png",
    ]
    assert "wrote" in capsys.readouterr().out


# --- bad input ------------------------------------------------------------------------------------


def bad_json(tmp_path: Path) -> str:
    path = tmp_path / "bad.json"
    path.write_text("{not json")
    return str(path)


def negative_cost_json(tmp_path: Path) -> str:
    path = tmp_path / "neg.json"
    path.write_text(json.dumps({"decode_base_ms": -1}))
    return str(path)


def unknown_field_json(tmp_path: Path) -> str:
    path = tmp_path / "unknown.json"
    path.write_text(json.dumps({"decode_ms": 1}))
    return str(path)


def empty_trace(tmp_path: Path) -> str:
    path = tmp_path / "empty.jsonl"
    path.write_text("\n")
    return str(path)


def pinned_outside_trace(tmp_path: Path) -> str:
    path = tmp_path / "pinned.jsonl"
    path.write_text(json.dumps({"time_s": 0, "prompt_tokens": 4, "output_tokens": 1, "rank": 7}))
    return str(path)


def huge_prompt_trace(tmp_path: Path) -> str:
    path = tmp_path / "huge.jsonl"
    path.write_text(json.dumps({"time_s": 0, "prompt_tokens": 5000, "output_tokens": 1}))
    return str(path)


# (argv after BASE, flag the message must name). Callables get tmp_path to build a file.
BAD_INPUT = [
    pytest.param(["--rate", "-1"], "--rate", id="negative-rate"),
    pytest.param(["--rate", "0"], "--rate", id="zero-rate"),
    pytest.param(["--num-requests", "0"], "--num-requests", id="no-requests"),
    pytest.param(["--input-len", "-5"], "--input-len", id="negative-input-len"),
    pytest.param(
        ["--router", "skewed", "--route-weights", "8,1,1,1"], "--route-weights", id="weights-vs-dp"
    ),
    pytest.param(["--router", "skewed"], "--route-weights", id="skewed-without-weights"),
    pytest.param(
        ["--router", "skewed", "--route-weights", "8,x"], "--route-weights", id="weights-not-ints"
    ),
    pytest.param(["--route-weights", "1,1"], "--route-weights", id="weights-without-skewed"),
    pytest.param(["--policy", "fastest"], "--policy", id="unknown-policy"),
    pytest.param(["--compare", "roundgate,magic"], "--compare", id="unknown-compared-policy"),
    pytest.param(["--arrival", "trace"], "--trace", id="trace-arrival-without-file"),
    pytest.param(
        ["--arrival", "trace", "--trace", "/nonexistent/t.jsonl"], "--trace", id="unreadable-trace"
    ),
    pytest.param(["--arrival", "trace", "--trace", empty_trace], "--trace", id="empty-trace"),
    pytest.param(
        ["--arrival", "trace", "--trace", pinned_outside_trace], "--trace", id="trace-rank-outside"
    ),
    pytest.param(["--costs", "nope"], "--costs", id="unknown-cost-preset"),
    pytest.param(["--costs", "/nonexistent/c.json"], "--costs", id="unreadable-costs"),
    pytest.param(["--costs", bad_json], "--costs", id="costs-invalid-json"),
    pytest.param(["--costs", unknown_field_json], "--costs", id="costs-unknown-field"),
    pytest.param(["--costs", negative_cost_json], "--costs", id="costs-negative-value"),
    pytest.param(["--decode-base-ms", "-1"], "--decode-base-ms", id="negative-cost-override"),
    pytest.param(["--dp-size", "0"], "--dp-size", id="zero-dp"),
    pytest.param(["--max-num-seqs", "1"], "--max-num-seqs", id="fewer-seqs-than-ranks"),
    pytest.param(["--prefill-attempt-interval", "0"], "--prefill-attempt-interval", id="attempt-0"),
    pytest.param(
        ["--prefill-attempt-interval", "8", "--prefill-any-attempt-interval", "4"],
        "--prefill-any-attempt-interval",
        id="any-below-attempt",
    ),
    pytest.param(["--max-rounds", "0"], "--max-rounds", id="zero-max-rounds"),
    pytest.param(["--input-len", "5000"], "--input-len", id="prompt-larger-than-a-rank-pool"),
    pytest.param(
        ["--arrival", "trace", "--trace", huge_prompt_trace], "--trace", id="trace-prompt-too-long"
    ),
]


@pytest.mark.parametrize(("argv", "flag"), BAD_INPUT)
def test_bad_input_is_a_one_line_error_naming_the_flag(
    tmp_path: Path, capsys, argv: list, flag: str
) -> None:
    argv = [a(tmp_path) if callable(a) else a for a in argv]
    with pytest.raises(SystemExit) as exc:
        simulate(*argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    # argparse prints the usage, then exactly one error line.
    error_lines = [line for line in err.splitlines() if "error:" in line]
    assert len(error_lines) == 1, err
    assert err.rstrip("\n").splitlines()[-1] == error_lines[0]
    assert error_lines[0].startswith("roundgate simulate: error: ")
    assert flag in error_lines[0], error_lines[0]
    assert "Traceback" not in err
