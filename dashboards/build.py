"""Render the dashboards to ``dashboards/*.json`` and list their PromQL.

The JSON sits directly in ``dashboards/`` because ``roundgate.k8s.tools.dashboards_configmap`` packs
``dashboards/*.json`` into the Grafana sidecar's ConfigMap. Output is stable: keys sorted,
two-space indent, panel ids numbered in layout order.

Usage: ``python -m dashboards`` rewrites the files; ``--check`` exits 1 when they are stale.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from grafana_foundation_sdk.builders.dashboard import Dashboard
from grafana_foundation_sdk.cog.encoder import JSONEncoder

from roundgate.dashboards import gate, serving

DIRECTORY = Path(__file__).resolve().parent
BOARDS: dict[str, Callable[[], Dashboard]] = {
    "roundgate-gate.json": gate.build,
    "roundgate-serving.json": serving.build,
}
# The Prometheus datasource's variable query `label_values(<series selector>, <label>)`.
LABEL_VALUES = re.compile(r"^label_values\((?P<selector>.+),\s*(?P<label>\w+)\)$")
VARIABLE = re.compile(r"\$\{?(?P<name>\w+)\}?")


def to_dict(builder: Dashboard) -> dict[str, Any]:
    """The dashboard model as plain JSON data, panels numbered 1.. in layout order."""
    model = builder.build()
    for number, panel in enumerate(model.panels or [], start=1):
        panel.id_val = number
    return json.loads(json.dumps(model, cls=JSONEncoder))


def render() -> dict[str, str]:
    """``{file name: JSON text}`` of every dashboard."""
    return {
        name: json.dumps(to_dict(build()), indent=2, sort_keys=True) + "\n"
        for name, build in BOARDS.items()
    }


def stale(directory: Path = DIRECTORY) -> list[str]:
    """File names in ``directory`` that differ from a fresh render, are missing or are extra."""
    files = render()
    on_disk = {path.name for path in directory.glob("*.json")}
    differ = [
        name
        for name, text in files.items()
        if not (directory / name).is_file()
        or (directory / name).read_text(encoding="utf-8") != text
    ]
    return sorted({*differ, *(on_disk - files.keys())})


def write(directory: Path = DIRECTORY) -> None:
    """Write every dashboard to ``directory`` and remove JSON files that are no longer built."""
    files = render()
    for path in directory.glob("*.json"):
        if path.name not in files:
            path.unlink()
    for name, text in files.items():
        (directory / name).write_text(text, encoding="utf-8")


def executable(expr: str, rate_interval: str = "1m") -> str:
    """``expr`` as plain PromQL: ``$__rate_interval`` set, every other variable "All" (``.*``).

    >>> executable('rate(x{group=~"$group"}[$__rate_interval])')
    'rate(x{group=~".*"}[1m])'
    """
    expr = expr.replace("$__rate_interval", rate_interval)
    return VARIABLE.sub(".*", expr)


def _dashboard_queries(board: dict[str, Any]) -> list[tuple[str, str]]:
    found = []
    for variable in board["templating"]["list"]:
        if variable["type"] != "query":
            continue
        match = LABEL_VALUES.match(variable["query"])
        if match is None:
            raise ValueError(f"variable {variable['name']}: not a label_values(selector, label)")
        found.append((f"variable {variable['name']}", match["selector"]))
    for panel in board["panels"]:
        found.extend((panel["title"], target["expr"]) for target in panel.get("targets", []))
    return found


def templated_queries() -> list[tuple[str, str]]:
    """(panel title, PromQL) of every target and variable query, as Grafana holds them.

    The dashboards share their variables; each variable query is listed once.
    """
    boards = [to_dict(build()) for build in BOARDS.values()]
    return list(dict.fromkeys(query for board in boards for query in _dashboard_queries(board)))


def queries(rate_interval: str = "1m") -> list[tuple[str, str]]:
    """(panel title, PromQL) of every panel target and variable query, ready to execute.

    Variables take their "All" value and ``$__rate_interval`` becomes ``rate_interval``; a
    variable query contributes the series selector inside its ``label_values(...)``.
    """
    return [(title, executable(expr, rate_interval)) for title, expr in templated_queries()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m dashboards", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--check", action="store_true", help="exit 1 if the JSON is stale")
    args = parser.parse_args(argv)
    if args.check:
        names = stale()
        if names:
            print(f"stale dashboards: {', '.join(names)}; run python -m dashboards")
            return 1
        return 0
    write()
    return 0


if __name__ == "__main__":
    sys.exit(main())
