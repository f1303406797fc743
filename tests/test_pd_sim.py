"""The simulator's P/D: the roles' real control plane in a prefill and a decode group, KV
transfers priced by the preset, and ``roundgate simulate --disaggregate P:D`` comparing it with
the fused group with and without the gate."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from sim_builders import make_spec, sim_args

from roundgate.cli.main import main
from roundgate.sim.disaggregated import parse_split, role_args, simulate_pd
from roundgate.sim.report import summarize
from roundgate.sim.round_costs import PRESETS
from roundgate.sim.router import RouterSpec
from roundgate.sim.spec import SimSpec

H100 = PRESETS["h100-dsv3"]


def pd_run(costs=H100, router: str = "round-robin", split=(1, 3), **workload):
    spec = SimSpec(
        sim_args("none", dp_size=4),
        make_spec(**workload),
        costs,
        RouterSpec(router),
        seed=7,
    )
    return simulate_pd(spec, *split)


def test_every_request_crosses_over_and_the_decode_group_never_prefills() -> None:
    result, sim = pd_run()
    assert result.unfinished == 0 and len(result.records) == 60
    assert sim.decode.num_extends == 0 and sim.prefill.num_extends >= 60
    assert sim.num_transfers == 60
    # Every prompt's pages moved (distinct prompts: nothing was cached on the decode side).
    pages = sum(-(-r.prompt_tokens // 16) for r in result.records)
    assert sim.num_pages_moved == pages and sim.num_pages_cached == 0
    for scheduler in sim.prefill.schedulers + sim.decode.schedulers:
        scheduler.pool.check_integrity()
        assert scheduler.pool.num_used_pages == 0
    assert not any(s.connector.pinned for s in sim.prefill.schedulers)
    # Every token after a request's first is one inter-token gap, all from the decode group.
    assert sum(r.num_output for r in result.records) == len(result.itl_ms) + 60


@pytest.mark.parametrize("router", ["round-robin", "least-loaded", "cache-aware"])
def test_a_dearer_transfer_delays_the_first_token(router: str) -> None:
    cheap = summarize(pd_run(router=router)[0])
    dear_costs = replace(H100, kv_transfer_base_ms=40.0, kv_transfer_per_token_ms=0.5)
    dear = summarize(pd_run(dear_costs, router=router)[0])
    assert dear["ttft_ms"]["p50"] > cheap["ttft_ms"]["p50"] + 40
    assert dear["requests"] == cheap["requests"] == 60 and dear["unfinished"] == 0


def test_role_args_keep_the_per_rank_limits_and_drop_the_gate() -> None:
    fused = sim_args("roundgate", dp_size=4)
    prefill, decode = role_args(fused, 2, 6)
    assert (prefill.dp_size, decode.dp_size) == (2, 6)
    assert prefill.max_batch_size == decode.max_batch_size == fused.max_batch_size
    assert prefill.prefill_policy_name == decode.prefill_policy_name == "none"
    assert (prefill.disaggregation_mode, decode.disaggregation_mode) == ("prefill", "decode")


@pytest.mark.parametrize("text", ["2", "0:8", "a:b", "2:8:1"])
def test_a_bad_split_is_refused_naming_the_flag(text: str) -> None:
    with pytest.raises(ValueError, match="--disaggregate"):
        parse_split(text)


def test_simulate_disaggregate_compares_fused_gate_and_pd(tmp_path: Path, capsys) -> None:
    path = tmp_path / "pd.json"
    argv = [
        "simulate", "--disaggregate", "1:3", "--max-num-seqs", "64", "--num-kv-pages", "128",
        "--page-size", "16", "--num-requests", "30", "--rate", "40", "--input-len", "120",
        "--output-len", "8", "--costs", "h100-dsv3", "--no-progress", "--json", str(path),
    ]  # fmt: skip
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "P/D 1:3: 30 transfers" in out
    report = json.loads(path.read_text())
    assert [r["policy"] for r in report["results"]] == ["none", "roundgate", "pd 1:3"]
    assert [r["dp_size"] for r in report["results"]] == [4, 4, 4]
    assert all(r["unfinished"] == 0 for r in report["results"])


def test_simulate_refuses_a_bad_split_as_a_flag_error(capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["simulate", "--disaggregate", "8", "--no-progress"])
    assert exc.value.code == 2
    assert "--disaggregate: expected P:D" in capsys.readouterr().err
