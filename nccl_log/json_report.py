"""Reader for the ``-J FILE`` report of nccl-tests (>= 2.17.3).

The writer is hand-rolled C, so a few quirks are part of the format: booleans are the strings
``"true"``/``"false"``, ``root`` is a space-padded string, NaN doubles are the string ``"nan"``,
``nwrong`` is null when validation was off, the average's ``okay`` is ``"unchecked"`` unless a
minimum bandwidth was set, and a run that crashed leaves an unterminated document.
"""

from __future__ import annotations

import json
import os
from typing import Any

from roundgate.nccl_log.result import (
    Measurement,
    NcclTestsResult,
    RankInfo,
    RunParams,
    SizeResult,
)


def parse_json(text: str) -> NcclTestsResult:
    """Parse one ``-J`` report; ``ValueError`` says which record or key is unreadable."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(
            f"line {exc.lineno}: nccl-tests JSON report is not valid JSON ({exc.msg}); "
            "an unterminated report means the run died before it finished"
        ) from None
    if not isinstance(doc, dict) or "results" not in doc:
        raise ValueError("nccl-tests JSON report has no 'results' list")
    config = doc.get("config") or {}
    sizes: list[SizeResult] = []
    num_empty = 0
    for index, record in enumerate(doc["results"]):
        where = f"results[{index}]"
        num_bytes = int(_get(record, "size", where))
        if num_bytes == 0:
            num_empty += 1
            continue
        sizes.append(
            SizeResult(
                num_bytes=num_bytes,
                count=int(_get(record, "count", where)),
                dtype=str(_get(record, "type", where)),
                redop=str(_get(record, "redop", where)),
                root=int(str(_get(record, "root", where)).strip()),
                out_of_place=_measurement(record, "out_of_place", where),
                in_place=_measurement(record, "in_place", where),
            )
        )
    out_of_bounds = doc.get("out_of_bounds")
    average = doc.get("average_bus_bandwidth")
    args = doc.get("args") or []
    return NcclTestsResult(
        sizes=tuple(sizes),
        ranks=tuple(_rank(device) for device in config.get("devices", [])),
        params=_params(config) if config else None,
        collective=os.path.basename(args[0]) if args else None,
        nccl_tests_version=doc.get("nccl_tests_version"),
        nccl_version=_nccl_version(doc.get("nccl_version")),
        num_empty_rows=num_empty,
        out_of_bounds=int(out_of_bounds["count"]) if out_of_bounds else None,
        avg_busbw_gbps=_double(average["bandwidth"]) if average else None,
        errors=tuple(e for e in doc.get("errors", []) if e),
    )


def _get(record: dict[str, Any], key: str, where: str) -> Any:
    if not isinstance(record, dict) or key not in record:
        raise ValueError(f"nccl-tests JSON report: {where} has no {key!r}")
    return record[key]


def _measurement(record: dict[str, Any], key: str, where: str) -> Measurement:
    half = _get(record, key, where)
    if half is None:
        raise ValueError(
            f"nccl-tests JSON report: {where}.{key} is null (a trace-replay run); "
            "both out-of-place and in-place results are needed"
        )
    time_key = "cpu_time" if "cpu_time" in half else "time"
    nwrong = half.get("nwrong")
    return Measurement(
        time_us=_double(_get(half, time_key, f"{where}.{key}")),
        algbw_gbps=_double(_get(half, "alg_bw", f"{where}.{key}")),
        busbw_gbps=_double(_get(half, "bus_bw", f"{where}.{key}")),
        num_wrong=None if nwrong is None else round(_double(nwrong)),
    )


def _double(value: Any) -> float:
    # NaN is written as the string "nan"; float() reads it and every other number.
    return float(value)


def _rank(device: dict[str, Any]) -> RankInfo:
    return RankInfo(
        rank=int(device["rank"]),
        group=int(device["group"]),
        pid=int(device["pid"]),
        hostname=str(device["hostname"]),
        device=int(device["device"]),
        bus_id=str(device.get("device_hex", "")),
        device_name=str(device.get("device_info", "")),
    )


def _params(config: dict[str, Any]) -> RunParams:
    return RunParams(
        num_threads=int(config.get("nthreads", 1)),
        num_gpus=int(config.get("ngpus", 1)),
        min_bytes=int(config.get("minimum_bytes", 0)),
        max_bytes=int(config.get("maximum_bytes", 0)),
        warmup_iters=int(config.get("warmup_iters", 0)),
        iters=int(config.get("iterations", 0)),
        validation=bool(int(config.get("validation", 1))),
        graph=int(config.get("graph", 0)),
    )


def _nccl_version(code: Any) -> str | None:
    """NCCL_VERSION_CODE (major*10000 + minor*100 + patch since 2.9) as ``"2.26.6"``."""
    if code is None:
        return None
    code = int(code)
    return f"{code // 10000}.{code // 100 % 100}.{code % 100}"
