"""``roundgate calibrate``: a ``--costs`` file from what a deployment measured.

Two sources, either or both:

- **an nccl-tests ``all_gather_perf`` log** (text or ``-J`` JSON) for the per-round metadata
  gather: its latency at the size of the group's gathered buffer, one int64 row per rank
  with the gate's five columns *plus the selected policy's extra columns* (SGLang's delayer
  gathers six more, the auto gate four);
- **Prometheus scrapes of the engine** for the round costs: the group's round-time histogram
  and the busiest rank's work by kind of round, recorded by rank 0; ``roundgate.sim.cost_fit``
  turns them into the decode, per-sequence, per-prompt-token and extend-round terms.

The output names a ``base`` preset for every field it does not set, and records where each
number came from under ``_source`` (ignored by ``--costs``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from roundgate.gate import registry
from roundgate.gate.rows import NUM_COLUMNS
from roundgate.gate.spec import PolicyContext
from roundgate.nccl_log.read import parse
from roundgate.sim.cost_fit import fit_round_costs, kind_totals
from roundgate.sim.gather_fit import calibrate_metadata_gather
from roundgate.sim.round_costs import PRESETS, load_costs


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


def calibrate(
    dp_size: int = 8,
    policy: str = "roundgate",
    base: str = "toy",
    nccl_log: Path | None = None,
    metrics: Sequence[Path] = (),
    baselines: Sequence[Path] = (),
) -> dict[str, Any]:
    """The ``--costs`` object of ``roundgate calibrate``: the gather from ``nccl_log``, the
    round costs fitted over the ``metrics`` scrapes (each less the run's baseline scrape at
    the same position), ``base`` for the rest, and ``_source``."""
    if nccl_log is None and not metrics:
        raise ValueError("give --nccl-log FILE and/or --metrics FILE")
    if dp_size < 1:
        raise ValueError(f"--dp-size must be >= 1, got {dp_size}")
    if base not in PRESETS:
        raise ValueError(f"--base must be one of {', '.join(PRESETS)}, got {base!r}")
    out: dict[str, Any] = {"base": base}
    source: dict[str, Any] = {}
    if nccl_log is not None:
        gather_ms, source["nccl"] = gather_from_nccl(_read("--nccl-log", nccl_log), dp_size, policy)
        out["gather_ms"] = gather_ms
    if metrics:
        costs, source["metrics"] = fit_round_costs(_runs(metrics, baselines))
        out |= costs
    out["_source"] = source
    load_costs("calibrated", json.dumps(out))  # the file must load as --costs
    return out


def _read(flag: str, path: Path) -> str:
    try:
        return path.read_text()
    except OSError as exc:
        raise ValueError(f"{flag} {path}: cannot read ({exc.strerror})") from exc


def _runs(scrapes: Sequence[Path], baselines: Sequence[Path]) -> list[dict]:
    """Each run's per-kind totals, its baseline's subtracted."""
    if len(baselines) > len(scrapes):
        raise ValueError(
            f"--metrics-baseline given {len(baselines)} times for {len(scrapes)} --metrics"
        )
    runs = []
    for i, path in enumerate(scrapes):
        baseline = _read("--metrics-baseline", baselines[i]) if i < len(baselines) else None
        runs.append(kind_totals(_read("--metrics", path), baseline))
    return runs
