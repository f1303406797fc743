"""The ``roundgate`` command: ``simulate`` and ``serve``."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from deployment.sim import cli as sim_cli


def _serve(ns: argparse.Namespace) -> int:
    print(
        "roundgate serve: would start a local Ray cluster on 127.0.0.1 and run "
        "deployment/configs/local.yaml (tiny MoE preset, dp=2, group gate on) with an "
        "OpenAI-compatible API on 127.0.0.1:8000.\n"
        "The Ray Serve deployment has not landed yet (see the DP-group and serving issues); "
        "try `roundgate simulate --help` meanwhile.",
        file=sys.stderr,
    )
    return 3


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="roundgate", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sim_cli.add_parser(sub)
    serve = sub.add_parser("serve", help="run the local deployment (127.0.0.1:8000)")
    serve.set_defaults(func=_serve, parser=serve)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    ns = parser.parse_args(argv)
    return ns.func(ns)


if __name__ == "__main__":
    raise SystemExit(main())
