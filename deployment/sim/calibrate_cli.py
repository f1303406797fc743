"""``roundgate calibrate``: write a ``--costs`` file from an nccl-tests log and/or a scrape."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from deployment.sim.calibration import gather_from_nccl, round_costs_from, round_means
from deployment.sim.round_costs import PRESETS, load_costs


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "calibrate",
        help="a --costs file from an nccl-tests all_gather_perf log and/or a metrics scrape",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--nccl-log", type=Path, default=None, help="all_gather_perf output")
    p.add_argument("--metrics", type=Path, default=None, help="Prometheus text scrape")
    p.add_argument("--dp-size", type=int, default=8)
    p.add_argument("--policy", default="roundgate", help="sizes the gathered row")
    p.add_argument("--base", default="toy", help=f"preset for unset fields ({', '.join(PRESETS)})")
    p.add_argument("--out", type=Path, default=None, help="write here (default: stdout)")
    p.set_defaults(func=run, parser=p)


def _read(flag: str, path: Path) -> str:
    try:
        return path.read_text()
    except OSError as exc:
        raise ValueError(f"{flag} {path}: cannot read ({exc.strerror})") from exc


def build(ns: argparse.Namespace) -> dict:
    if ns.nccl_log is None and ns.metrics is None:
        raise ValueError("give --nccl-log FILE and/or --metrics FILE")
    if ns.dp_size < 1:
        raise ValueError(f"--dp-size must be >= 1, got {ns.dp_size}")
    if ns.base not in PRESETS:
        raise ValueError(f"--base must be one of {', '.join(PRESETS)}, got {ns.base!r}")
    out: dict = {"base": ns.base}
    source: dict = {}
    if ns.nccl_log is not None:
        gather_ms, source["nccl"] = gather_from_nccl(
            _read("--nccl-log", ns.nccl_log), ns.dp_size, ns.policy
        )
        out["gather_ms"] = gather_ms
    if ns.metrics is not None:
        means = round_means(_read("--metrics", ns.metrics))
        out |= round_costs_from(means)
        source["metrics"] = {
            "decode_round_ms": round(means.decode_ms, 4),
            "extend_round_ms": round(means.extend_ms, 4),
            "decode_rounds": means.decode_rounds,
            "extend_rounds": means.extend_rounds,
        }
    out["_source"] = source
    load_costs("calibrated", json.dumps(out))  # the file must load as --costs
    return out


def run(ns: argparse.Namespace) -> int:
    try:
        out = build(ns)
    except ValueError as exc:
        ns.parser.error(str(exc))
    text = json.dumps(out, indent=2, sort_keys=True) + "\n"
    if ns.out is None:
        print(text, end="")
    else:
        ns.out.parent.mkdir(parents=True, exist_ok=True)
        ns.out.write_text(text)
        print(f"wrote {ns.out}")
    return 0
