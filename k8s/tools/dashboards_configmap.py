"""Generate the Grafana dashboards ConfigMap from ``dashboards/*.json`` (never edit it by hand).

The Grafana sidecar (kube-prometheus-stack's ``grafana.sidecar.dashboards``) loads every
ConfigMap labelled ``grafana_dashboard: "1"``; each data key is one dashboard file. An empty
``dashboards/`` gives a ConfigMap with no data, which is still valid to apply.

Usage: ``python -m k8s.tools.dashboards_configmap`` rewrites the file;
``--check`` exits 1 when the committed file is stale.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
DASHBOARDS = REPO / "dashboards"
OUTPUT = REPO / "k8s" / "base" / "serve" / "grafana-dashboards.yaml"
NAME = "roundgate-grafana-dashboards"
MAX_CONFIGMAP_BYTES = 1 << 20  # the API server refuses larger objects
HEADER = """\
# Grafana dashboards for the Grafana sidecar (label grafana_dashboard: "1").
# GENERATED from dashboards/*.json by `python -m k8s.tools.dashboards_configmap`: do not edit.
"""


def dashboard_files(directory: Path = DASHBOARDS) -> dict[str, str]:
    """``{file name: text}`` of every dashboard JSON, checked to be JSON objects."""
    files = {}
    for path in sorted(directory.glob("*.json")):
        text = path.read_text(encoding="utf-8")
        if not isinstance(json.loads(text), dict):
            raise ValueError(f"{path}: a dashboard must be a JSON object")
        files[path.name] = text
    return files


def build_configmap(directory: Path = DASHBOARDS) -> dict[str, Any]:
    """The ConfigMap object for the dashboards in ``directory``."""
    data = dashboard_files(directory)
    size = sum(len(k) + len(v.encode()) for k, v in data.items())
    if size > MAX_CONFIGMAP_BYTES:
        raise ValueError(f"dashboards take {size} bytes, over the 1 MiB ConfigMap limit")
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": NAME,
            "labels": {"grafana_dashboard": "1", "app.kubernetes.io/name": "roundgate"},
            "annotations": {"grafana_folder": "roundgate"},
        },
        "data": data,
    }


def render(directory: Path = DASHBOARDS) -> str:
    """The file text: header comment plus the ConfigMap as YAML."""
    body = yaml.safe_dump(build_configmap(directory), sort_keys=False, width=1 << 16)
    return HEADER + body


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the file is stale")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        current = OUTPUT.read_text(encoding="utf-8") if OUTPUT.exists() else ""
        if current != text:
            print(f"{OUTPUT} is stale: run python -m k8s.tools.dashboards_configmap")
            return 1
        return 0
    OUTPUT.parent.mkdir(parents=True, exist_ok=True)
    OUTPUT.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
