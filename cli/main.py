"""The ``roundgate`` command: ``serve``, ``simulate``, ``tune``, ``bench`` and ``calibrate``."""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from pathlib import Path

from roundgate.bench import cli as bench_cli
from roundgate.deployment.local import DEFAULT_CONFIG
from roundgate.sim import calibrate_cli, tune
from roundgate.sim import cli as sim_cli


def _serve(ns: argparse.Namespace) -> int:
    from roundgate.deployment.local import serve_forever

    try:
        return serve_forever(ns.config, address=ns.address or os.environ.get("RAY_ADDRESS"))
    except ValueError as exc:
        ns.parser.error(str(exc))
        return 2


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="roundgate", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sim_cli.add_parser(sub)
    tune.add_parser(sub)
    serve = sub.add_parser("serve", help="run the local deployment (127.0.0.1:8000)")
    serve.add_argument(
        "--config",
        type=Path,
        default=DEFAULT_CONFIG,
        help="a `serve run` config (default: deployment/configs/local.yaml)",
    )
    serve.add_argument(
        "--address",
        default=None,
        help="join this running Ray cluster (host:port of its head; default $RAY_ADDRESS) "
        "instead of starting a local one; stopping removes only the app",
    )
    serve.set_defaults(func=_serve, parser=serve)
    bench_cli.add_parser(sub)
    calibrate_cli.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    ns = parser.parse_args(argv)
    return ns.func(ns)


if __name__ == "__main__":
    raise SystemExit(main())
