"""``roundgate simulate --compare all``, workload presets, cost files, and ``roundgate tune``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from roundgate.cli.main import main
from roundgate.gate import registry
from roundgate.sim.workload import WORKLOADS

SMALL = [
    "--dp-size", "2",
    "--max-num-seqs", "16",
    "--num-kv-pages", "128",
    "--page-size", "16",
    "--num-requests", "24",
    "--rate", "50",
    "--input-len", "64",
    "--output-len", "6",
    "--no-progress",
]  # fmt: skip


def simulate_json(tmp_path: Path, name: str, *extra: str) -> dict:
    path = tmp_path / name
    assert main(["simulate", *SMALL, "--json", str(path), *extra]) == 0
    return json.loads(path.read_text())


def error_line(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err.strip().splitlines()[-1]


@pytest.mark.parametrize(
    "extra",
    [
        ("--router", "skewed", "--route-weights", "3,1"),
        ("--arrival", "bursty", "--enable-mixed-prefill-decode", "--length-dist", "exponential"),
    ],
)
def test_compare_all_same_seed_same_numbers_for_every_policy(tmp_path: Path, extra) -> None:
    first = simulate_json(tmp_path, "a.json", "--compare", "all", "--seed", "3", *extra)
    second = simulate_json(tmp_path, "b.json", "--compare", "all", "--seed", "3", *extra)
    assert [r["policy"] for r in first["results"]] == list(registry.names())
    for a, b in zip(first["results"], second["results"], strict=True):
        assert a == b, a["policy"]
    assert first["ratios_to_none"] == second["ratios_to_none"]
    assert first["ratios_to_none"]["none"]["decode_round_fraction"] == 1.0
    assert all(r["unfinished"] == 0 for r in first["results"])


def test_compare_all_plots_every_policy_and_the_ratio_bars(tmp_path: Path) -> None:
    out = tmp_path / "plots"
    assert main(["simulate", *SMALL, "--compare", "all", "--plot", str(out)]) == 0
    names = {p.name for p in out.iterdir()}
    assert {f"timeline_{p}.png" for p in registry.names()} <= names
    assert {"ttft_cdf.png", "itl_cdf.png", "ratios.png"} <= names
    assert all(p.stat().st_size < 200_000 for p in out.iterdir())


@pytest.mark.parametrize("workload", sorted(WORKLOADS))
def test_workload_presets_set_the_lengths(tmp_path: Path, workload: str) -> None:
    argv = [a for a in SMALL if a not in ("--input-len", "64", "--output-len", "6")]
    path = tmp_path / "w.json"
    argv += ["--workload", workload, "--num-kv-pages", "1024", "--max-rounds", "50"]
    assert main(["simulate", *argv, "--json", str(path)]) == 0
    config = json.loads(path.read_text())["config"]
    preset = WORKLOADS[workload]
    assert (config["input_len"], config["output_len"]) == (preset.input_len, preset.output_len)
    assert config["length_dist"] == preset.length_dist


def test_explicit_lengths_override_the_workload_preset(tmp_path: Path) -> None:
    report = simulate_json(tmp_path, "o.json", "--workload", "agentic", "--length-dist", "fixed")
    assert (report["config"]["input_len"], report["config"]["output_len"]) == (64, 6)
    assert report["config"]["length_dist"] == "fixed"
    assert report["results"][0]["output_tokens"] == 24 * 6


def test_a_cost_file_may_set_every_field(tmp_path: Path) -> None:
    costs = {
        "base": "gb200-dsv3",
        "decode_base_ms": 11.0,
        "decode_per_seq_ms": 0.5,
        "prefill_per_token_ms": 0.02,
        "extend_overhead_ms": 7.0,
        "gather_ms": 0.25,
        "decode_per_kv_token_ms": 1e-5,
        "schedule_lag_ms": 40.0,
        "plan_ahead_rounds": 1,
        "gc_every_requests": 64,
        "gc_pause_per_request_ms": 0.5,
        "kv_transfer_base_ms": 0.3,
        "kv_transfer_per_token_ms": 0.001,
    }
    path = tmp_path / "costs.json"
    path.write_text(json.dumps(costs))
    report = simulate_json(tmp_path, "c.json", "--costs", str(path))
    costs.pop("base")
    assert report["config"]["resolved_costs"] == costs


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["--workload", "gaming"], "--workload"),
        (
            ["--policy", "vllm-interval", "--prefill-schedule-interval", "0"],
            "--prefill-schedule-interval",
        ),
        (
            ["--policy", "sglang-delayer", "--prefill-delayer-token-usage-low-watermark", "2"],
            "--prefill-delayer-token-usage-low-watermark",
        ),
        (
            ["--policy", "trtllm-balance", "--attention-dp-timeout-iters", "0"],
            "--attention-dp-timeout-iters",
        ),
        (["--plan-ahead-rounds", "0.5"], "--plan-ahead-rounds"),
        (["--gc-every-requests", "2.5"], "--gc-every-requests"),
        (["--gc-pause-per-request-ms", "-1"], "--gc-pause-per-request-ms"),
        (["--schedule-lag-ms", "-1"], "--schedule-lag-ms"),
        (["--concurrency", "0"], "--concurrency"),
        (["--router", "vllm-lb", "--route-weights", "1,1"], "--route-weights"),
        (["--router", "vllm-lb", "--lb-api-servers", "0"], "--lb-api-servers"),
        (["--router", "round-robin", "--lb-api-servers", "2"], "--lb-api-servers"),
        (["--policy", "roundgate-auto", "--prefill-max-wait-ms", "0"], "--prefill-max-wait-ms"),
        (
            ["--policy", "roundgate-auto", "--prefill-auto-hold-rounds", "-1"],
            "--prefill-auto-hold-rounds",
        ),
    ],
)
def test_bad_simulate_flags_name_the_flag(capsys, argv: list[str], flag: str) -> None:
    line = error_line(capsys, ["simulate", *SMALL, *argv])
    assert line.startswith("roundgate simulate: error: ") and flag in line


# --- tune ---------------------------------------------------------------------------------------

TUNE = [
    "tune",
    *[a for a in SMALL if a != "--no-progress"],
    "--costs", "h100-dsv3",
    "--attempt-intervals", "1,2",
    "--any-intervals", "2,8",
]  # fmt: skip


def test_tune_recommends_the_best_goodput_with_a_runner_up_table(tmp_path: Path, capsys) -> None:
    path = tmp_path / "tune.json"
    assert main([*TUNE, "--json", str(path), "--top", "2"]) == 0
    out = capsys.readouterr().out.splitlines()
    report = json.loads(path.read_text())
    best = report["recommended"]
    assert out[0].startswith(
        f"recommended: --prefill-attempt-interval {best['attempt_interval']} "
        f"--prefill-any-attempt-interval {best['any_interval']}"
    )
    assert out[1].startswith("setting") and out[-1].startswith("none")
    assert len(out) == 2 + 2 + 1  # line, header, top 2, the none baseline
    pairs = {(c["attempt_interval"], c["any_interval"]) for c in report["candidates"]}
    assert pairs == {(1, 2), (1, 8), (2, 2), (2, 8)}
    assert best["goodput_rps"] == max(c["goodput_rps"] for c in report["candidates"])


def test_tune_is_reproducible(tmp_path: Path) -> None:
    reports = []
    for name in ("a.json", "b.json"):
        assert main([*TUNE, "--json", str(tmp_path / name)]) == 0
        reports.append(json.loads((tmp_path / name).read_text()))
    assert reports[0] == reports[1]


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["--ttft-slo-ms", "0"], "--ttft-slo-ms"),
        (["--itl-slo-ms", "-1"], "--itl-slo-ms"),
        (["--attempt-intervals", "1,x"], "--attempt-intervals"),
        (["--attempt-intervals", "0,2"], "--attempt-intervals"),
        (["--attempt-intervals", "16", "--any-intervals", "4,8"], "--any-intervals"),
        (["--top", "0"], "--top"),
        (["--workload", "nope"], "--workload"),
        (["--rate", "-3"], "--rate"),
    ],
)
def test_bad_tune_flags_name_the_flag(capsys, argv: list[str], flag: str) -> None:
    line = error_line(capsys, [*TUNE, *argv])
    assert line.startswith("roundgate tune: error: ") and flag in line
