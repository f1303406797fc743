"""``roundgate calibrate``: a ``--costs`` file from what a deployment measured.

Two sources, either or both:

- **an nccl-tests ``all_gather_perf`` log** (text or ``-J`` JSON) for the per-round metadata
  gather: its latency at the size of the group's gathered buffer, one int64 row per rank
  with the gate's five columns *plus the selected policy's extra columns* (SGLang's delayer
  gathers six more, the auto gate four);
- **Prometheus scrapes of the engine** for the round costs: the group's round-time histogram
  and the busiest rank's work by kind of round, recorded by rank 0; ``sim.cost_fit``
  turns them into the decode, per-sequence, per-prompt-token and extend-round terms.

The output names a ``base`` preset for every field it does not set, and records where each
number came from under ``_source`` (ignored by ``--costs``).
"""

from __future__ import annotations

import re

from gate import registry
from gate.rows import NUM_COLUMNS
from gate.spec import PolicyContext
from k8s.tools.nccl_tests import calibrate_metadata_gather, parse


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
