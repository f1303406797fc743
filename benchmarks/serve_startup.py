"""How long ``roundgate serve`` takes to its ready line, and where the time goes.

    .venv/bin/python benchmarks/serve_startup.py [--config deployment/configs/local.yaml]
        [--runs 3] [--json out.json] [--checkout DIR]

Each run starts the command as ``make serve`` does (a new local Ray cluster), reads its output
as it comes, and notes when Serve started, when the ingress replica and each rank replica
finished initializing (Serve's own replica logs, read from the Ray session's log folder) and
when the ready line came; then stops it with Ctrl-C as a user would. Prints each run's phases
and the medians. ``--checkout DIR`` runs another checkout of the project instead (``python -m
roundgate`` started in it, so its own ``roundgate/`` and folders are the ones imported), for a
before/after on one machine.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

from common import REPO

READY = "roundgate ready on"
SERVE_STARTED = "Started Serve in namespace"
FINISHED = re.compile(
    r"INFO (\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) roundgate_(\w+) \w+ -- Finished initializing"
)


def _replica_logs(after: float) -> dict[str, list[float]]:
    """Deployment -> when each of its replicas finished initializing (epoch seconds), from the
    newest Ray session's Serve logs written after ``after``."""
    folder = Path("/tmp/ray/session_latest/logs/serve")
    done: dict[str, list[float]] = {}
    for path in folder.glob("replica_*.log"):
        if path.stat().st_mtime < after:
            continue
        for match in FINISHED.finditer(path.read_text(errors="replace")):
            stamp = datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
            done.setdefault(match.group(2), []).append(stamp)
    return done


def one_run(config: Path, timeout_s: float, checkout: Path | None) -> dict[str, float]:
    if checkout is None:
        command = [str(Path(sys.executable).with_name("roundgate")), "serve"]
    else:
        command = [sys.executable, "-m", "roundgate", "serve"]
    command += ["--config", str(config)]
    start = time.time()
    process = subprocess.Popen(
        command,
        cwd=checkout or REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    phases: dict[str, float] = {}
    assert process.stdout is not None
    try:
        for line in process.stdout:
            now = time.time() - start
            if SERVE_STARTED in line:
                phases.setdefault("serve_started_s", now)
            if READY in line:
                phases["ready_s"] = now
                break
            if now > timeout_s:
                break
        if "ready_s" not in phases:
            raise RuntimeError(f"no ready line within {timeout_s:.0f} s (exit {process.poll()})")
        for deployment, stamps in _replica_logs(start).items():
            phases[f"{deployment}_ready_s"] = max(stamps) - start
    finally:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    return phases


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", type=Path, default=REPO / "deployment/configs/local.yaml")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--timeout-s", type=float, default=300)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--checkout", type=Path, default=None, help="another checkout to run")
    ns = parser.parse_args()
    runs = []
    for i in range(ns.runs):
        phases = one_run(ns.config.resolve(), ns.timeout_s, ns.checkout)
        runs.append(phases)
        print(f"run {i + 1}: " + ", ".join(f"{k} {v:.1f}" for k, v in sorted(phases.items())))
    keys = sorted({k for r in runs for k in r})
    medians = {k: statistics.median(r[k] for r in runs if k in r) for k in keys}
    print("median: " + ", ".join(f"{k} {v:.1f}" for k, v in medians.items()))
    if ns.json:
        ns.json.write_text(json.dumps({"runs": runs, "median": medians}, indent=2))


if __name__ == "__main__":
    main()
