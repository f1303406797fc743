"""``roundgate calibrate``: a ``--costs`` file from what a deployment measured.

Two sources, either or both:

- **an nccl-tests ``all_gather_perf`` log** (text or ``-J`` JSON) for the per-round metadata
  gather: its latency at the size of the group's gathered buffer, one int64 row per rank
  with the gate's five columns *plus the selected policy's extra columns* (SGLang's delayer
  gathers six more, the auto gate four);
- **a Prometheus scrape of the engine** for the round costs: the group's round-time
  histogram by kind (``roundgate_group_round_duration_seconds{kind=decode|extend}``, recorded
  by rank 0) gives the mean decode round and the mean extend round. The file then prices a
  round as the measured decode round (``decode_base_ms``, the per-sequence and per-token
  terms zero) plus the measured difference on extend rounds (``extend_overhead_ms``): the
  two numbers the scrape pins, nothing fitted beyond them.

The output names a ``base`` preset for every field it does not set, and records where each
number came from under ``_source`` (ignored by ``--costs``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

from gate import registry
from gate.rows import NUM_COLUMNS
from gate.spec import PolicyContext
from kernels.nccl_tests import calibrate_metadata_gather, parse

GROUP_ROUND = "roundgate_group_round_duration_seconds"


@dataclass(frozen=True)
class RoundMeans:
    """Mean busy group round (ms) by kind, and how many rounds each mean covers."""

    decode_ms: float
    extend_ms: float
    decode_rounds: int
    extend_rounds: int


def gather_columns(policy: str, dp_size: int) -> int:
    """Int64 columns in one rank's gathered row under ``policy`` (gate columns + extras)."""
    spec = registry.get(policy)
    flags = registry.comparison_flags(policy, {})
    built = spec.build(spec.make_config(flags), PolicyContext(0, dp_size, 1))
    return NUM_COLUMNS + len(built.extra_columns)


def gather_from_nccl(text: str, dp_size: int, policy: str) -> tuple[float, dict]:
    """``gather_ms`` from an ``all_gather_perf`` log, and its provenance."""
    try:
        result = parse(text)
    except ValueError as exc:
        raise ValueError(f"--nccl-log: cannot parse ({exc})") from exc
    if result.collective is None:
        # Older nccl-tests print no collective name; the command line in the log names it.
        named = set(re.findall(r"\b(\w+)_perf\b", text))
        if named and "all_gather" not in named:
            raise ValueError(
                f"--nccl-log: calibration needs an all_gather_perf run, got {sorted(named)}"
            )
    columns = gather_columns(policy, dp_size)
    try:
        cal = calibrate_metadata_gather(result, dp_size, columns)
    except ValueError as exc:
        raise ValueError(f"--nccl-log: {exc}") from exc
    source = {
        "collective": result.collective,
        "columns": columns,
        "bytes": cal.num_bytes,
        "time_us": round(cal.time_us, 3),
    }
    return round(cal.time_us / 1000.0, 6), source


def round_means(scrape: str) -> RoundMeans:
    """Mean decode and extend group rounds from a Prometheus text scrape (all groups)."""
    sums = {"decode": 0.0, "extend": 0.0}
    counts = {"decode": 0.0, "extend": 0.0}
    try:
        families = list(text_string_to_metric_families(scrape))
    except ValueError as exc:
        raise ValueError(f"--metrics: not a Prometheus text scrape ({exc})") from exc
    for family in families:
        if family.name != GROUP_ROUND:
            continue
        for sample in family.samples:
            kind = sample.labels.get("kind")
            if kind not in sums:
                continue
            if sample.name.endswith("_sum"):
                sums[kind] += sample.value
            elif sample.name.endswith("_count"):
                counts[kind] += sample.value
    for kind in ("decode", "extend"):
        if counts[kind] < 1:
            raise ValueError(
                f"--metrics: no {kind} rounds in {GROUP_ROUND} (scrape a group that ran both)"
            )
    return RoundMeans(
        decode_ms=1000.0 * sums["decode"] / counts["decode"],
        extend_ms=1000.0 * sums["extend"] / counts["extend"],
        decode_rounds=int(counts["decode"]),
        extend_rounds=int(counts["extend"]),
    )


def round_costs_from(means: RoundMeans) -> dict[str, float]:
    """The ``--costs`` fields the two measured means set."""
    return {
        "decode_base_ms": round(means.decode_ms, 4),
        "decode_per_seq_ms": 0.0,
        "decode_per_kv_token_ms": 0.0,
        "prefill_per_token_ms": 0.0,
        "extend_overhead_ms": round(max(0.0, means.extend_ms - means.decode_ms), 4),
    }
