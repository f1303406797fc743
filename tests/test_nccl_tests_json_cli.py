"""nccl-tests ``-J`` reports, the CLI, the command builder and the gather calibration."""

from __future__ import annotations

import dataclasses
import io
import json
from pathlib import Path
from typing import Any

import pytest
from nccl_samples import ALL_GATHER_SAMPLES, cases, read, sample_path

from roundgate.gate.rows import NUM_COLUMNS
from roundgate.k8s.tools.nccl_tests import (
    NcclTestsResult,
    all_gather_command,
    parse,
    parse_json,
    parse_text,
)
from roundgate.k8s.tools.nccl_tests.__main__ import main
from roundgate.sim.gather_fit import (
    METADATA_COLUMNS,
    calibrate_metadata_gather,
    gather_cost_overrides,
    interpolate_time_us,
    metadata_gather_bytes,
)
from roundgate.sim.round_costs import load_costs


def make_report(result: NcclTestsResult, binary: str = "/usr/local/bin/all_gather_perf") -> str:
    """A ``-J`` document with the writer's quirks (string booleans, padded root, %lf doubles)."""

    def half(m: Any) -> dict[str, Any]:
        nwrong = None if m.num_wrong is None else float(m.num_wrong)
        return {"time": m.time_us, "alg_bw": m.algbw_gbps, "bus_bw": m.busbw_gbps, "nwrong": nwrong}

    rows = [
        {"size": 0, "count": 0, "type": "float", "redop": "none", "root": "    -1"}
    ] * result.num_empty_rows + [
        {
            "size": s.num_bytes,
            "count": s.count,
            "type": s.dtype,
            "redop": s.redop,
            "root": f"{s.root:6d}",
            "out_of_place": half(s.out_of_place),
            "in_place": half(s.in_place),
            "actual_iterations": 20,
            "experiment_name": "",
        }
        for s in result.sizes
    ]
    for row in rows[: result.num_empty_rows]:
        row.update(out_of_place=half(result.sizes[0].out_of_place), in_place=None)
    devices = [
        {
            "rank": r.rank,
            "group": r.group,
            "pid": r.pid,
            "hostname": r.hostname,
            "device": r.device,
            "device_hex": r.bus_id,
            "device_info": r.device_name,
        }
        for r in result.ranks
    ]
    doc = {
        "version": 3,
        "start_time": "2025-11-01 10:00:00",
        "args": [binary, "-b", "8", "-e", "1G"],
        "env": [],
        "nccl_version": 22606,
        "config": {"nthreads": 1, "ngpus": 1, "validation": 1, "devices": devices},
        "results": rows,
        "out_of_bounds": {"count": result.out_of_bounds, "okay": "true"},
        "average_bus_bandwidth": {"bandwidth": result.avg_busbw_gbps, "okay": "unchecked"},
        "errors": [""],
    }
    return json.dumps(doc, separators=(",", ":"))


@pytest.mark.parametrize(
    "key",
    cases(*ALL_GATHER_SAMPLES),
)
def test_json_report_reads_like_the_text_table(key: str) -> None:
    from_text = parse_text(read(key))
    from_json = parse(make_report(from_text))
    assert from_json.sizes == from_text.sizes
    assert from_json.ranks == from_text.ranks
    assert from_json.num_empty_rows == from_text.num_empty_rows
    assert (from_json.out_of_bounds, from_json.avg_busbw_gbps) == (0, from_text.avg_busbw_gbps)
    assert from_json.collective == "all_gather_perf"
    assert from_json.nccl_version == "2.26.6"
    assert from_json.errors == ()


@pytest.mark.parametrize("key", cases("repo:allgather_4gpu_ok.txt", "shared:sample_1.txt"))
def test_json_nulls_and_nan(key: str) -> None:
    doc = json.loads(make_report(parse_text(read(key))))
    empty = parse_text(read(key)).num_empty_rows  # the size-0 rows come first, then sizes[0]
    doc["results"][empty]["out_of_place"]["nwrong"] = None
    doc["results"][empty + 1]["in_place"]["time"] = "nan"
    result = parse_json(json.dumps(doc))
    assert result.sizes[0].out_of_place.num_wrong is None
    assert result.sizes[1].in_place.time_us != result.sizes[1].in_place.time_us  # NaN


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"version":3,"results":[{"size":8,', "line 1: nccl-tests JSON report is not valid"),
        ('{"version":3}', "no 'results' list"),
        ('{"results":[{"size":8,"count":2}]}', r"results\[0\] has no 'type'"),
    ],
)
def test_bad_json_names_the_problem(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse(text)


@pytest.mark.parametrize(
    ("key", "extra", "code", "start"),
    cases(
        (
            "repo:allgather_4gpu_ok.txt",
            ["--min-busbw", "100", "--ranks", "4"],
            0,
            "OK: busbw 105.91",
        ),
        ("repo:allgather_4gpu_ok.txt", ["--min-busbw", "110"], 1, "FAIL: busbw 105.91 GB/s"),
        ("repo:allreduce_8gpu_wrong.txt", ["--min-busbw", "1"], 1, "FAIL: output ends before"),
        ("shared:sample_1.txt", ["--min-busbw", "30", "--ranks", "2"], 0, "OK: busbw 36.67 GB/s"),
        ("shared:sample_1.txt", ["--min-busbw", "40"], 1, "FAIL: busbw 36.67 GB/s"),
        ("shared:sample_6.txt", ["--min-busbw", "1"], 1, "FAIL: output ends before"),
    ),
)
def test_cli(key: str, extra: list[str], code: int, start: str, capsys: Any) -> None:
    assert main([str(sample_path(key)), *extra]) == code
    out = capsys.readouterr().out
    assert out.startswith(start)
    assert out.count("\n") == 1


@pytest.mark.parametrize(
    ("key", "min_busbw"),
    cases(("repo:allreduce_2host_ok.txt", "20"), ("shared:sample_5.txt", "600")),
)
def test_cli_reads_stdin(key: str, min_busbw: str, monkeypatch: Any, capsys: Any) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO(read(key)))
    assert main(["-", "--min-busbw", min_busbw]) == 0
    assert capsys.readouterr().out.startswith("OK:")


def test_cli_unreadable_input_exits_2(tmp_path: Path, capsys: Any) -> None:
    bad = tmp_path / "bad.txt"
    bad.write_text("no table here\n")
    assert main([str(bad), "--min-busbw", "1"]) == 2
    assert "no nccl-tests result table found" in capsys.readouterr().out
    assert main([str(tmp_path / "missing.txt"), "--min-busbw", "1"]) == 2


def test_all_gather_command() -> None:
    argv = all_gather_command(8, json_path="/tmp/r.json")
    assert " ".join(argv) == "all_gather_perf -b 8 -e 1G -f 2 -g 8 -n 20 -w 5 -c 1 -J /tmp/r.json"
    with pytest.raises(ValueError, match="num_gpus"):
        all_gather_command(0)


def test_metadata_gather_matches_the_gate_row() -> None:
    assert METADATA_COLUMNS == NUM_COLUMNS
    assert metadata_gather_bytes(8) == 8 * NUM_COLUMNS * 8
    with pytest.raises(ValueError, match="dp_size"):
        metadata_gather_bytes(0)


def test_calibration_interpolates_on_the_repo_sample() -> None:
    result = parse_text(read("repo:allgather_4gpu_ok.txt"))  # 4 ranks, all_gather, 64 B..256 MiB
    by_size = {s.num_bytes: s.out_of_place.time_us for s in result.sizes}
    assert interpolate_time_us(result, 1024) == by_size[1024] == 9.24
    assert interpolate_time_us(result, 8) == by_size[64]  # latency floor below the smallest
    middle = interpolate_time_us(result, 1448)  # ~2**10.5: halfway in log2
    assert middle == pytest.approx((by_size[1024] + by_size[2048]) / 2, rel=1e-3)
    assert interpolate_time_us(result, 512 << 20) == pytest.approx(2 * by_size[256 << 20])
    calibration = calibrate_metadata_gather(result, dp_size=8)
    assert calibration.num_bytes == 320
    assert calibration.time_us == pytest.approx(8.8)  # 256 B and 512 B both took 8.80 us
    assert 8.5 < calibration.latency.latency_us < 9.5
    overrides = gather_cost_overrides(calibration, base="gb200-dsv3")
    costs = load_costs("calibrated.json", json.dumps(overrides))
    assert costs.gather_ms == pytest.approx(calibration.time_us / 1000, abs=1e-6)


@pytest.mark.parametrize("key", cases("shared:sample_5.txt"))
def test_calibration_interpolates_between_measured_sizes(key: str) -> None:
    result = parse_text(read(key))  # 8 x B200, all_gather
    by_size = {s.num_bytes: s.out_of_place.time_us for s in result.sizes}
    assert interpolate_time_us(result, 256) == by_size[256]
    assert interpolate_time_us(result, 8) == by_size[128]  # latency floor below the smallest
    middle = interpolate_time_us(result, 362)  # ~2**8.5: halfway in log2
    assert middle == pytest.approx((by_size[256] + by_size[512]) / 2, rel=1e-3)
    assert interpolate_time_us(result, 32 << 30) == pytest.approx(2 * by_size[16 << 30])
    calibration = calibrate_metadata_gather(result, dp_size=8)
    assert calibration.num_bytes == 320
    assert 16.0 < calibration.time_us < 16.3
    assert 15.0 < calibration.latency.latency_us < 17.0
    overrides = gather_cost_overrides(calibration, base="gb200-dsv3")
    costs = load_costs("calibrated.json", json.dumps(overrides))
    assert costs.gather_ms == pytest.approx(calibration.time_us / 1000, abs=1e-6)


@pytest.mark.parametrize("key", cases("repo:allreduce_8gpu_wrong.txt", "shared:sample_7.txt"))
def test_calibration_refuses_another_collective(key: str) -> None:
    result = parse_text(read(key))
    with pytest.raises(ValueError, match="all_gather_perf run, got all_reduce_perf"):
        calibrate_metadata_gather(result, dp_size=8)
    with pytest.raises(ValueError, match="no measured sizes"):
        interpolate_time_us(dataclasses.replace(result, sizes=()), 64)
