"""The ``roundgate`` command: ``serve``, ``simulate``, ``tune``, ``bench``, ``calibrate`` and
``eplb-plan``."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from roundgate.bench import cli as bench_cli
from roundgate.cli import eplb_plan, serve
from roundgate.sim import calibrate_cli, tune
from roundgate.sim import cli as sim_cli


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="roundgate", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sim_cli.add_parser(sub)
    tune.add_parser(sub)
    serve.add_parser(sub)
    bench_cli.add_parser(sub)
    calibrate_cli.add_parser(sub)
    eplb_plan.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    ns = parser.parse_args(argv)
    return ns.func(ns)


if __name__ == "__main__":
    raise SystemExit(main())
