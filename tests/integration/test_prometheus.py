"""A real Prometheus scrapes the local deployment; the gate's counters move as the workload
implies, and every PromQL expression of every dashboard panel executes successfully.

No fixed sleeps: every wait polls Prometheus (or ``/metrics``) for the condition it needs, with
a deadline, and a timeout says what was awaited and what was last seen."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from helpers import BackgroundStream, WaitTimeout, complete, wait_for

from roundgate.actors.replica.rendezvous import free_port
from roundgate.dashboards.build import queries

pytestmark = pytest.mark.skipif(
    shutil.which("prometheus") is None, reason="Debian package prometheus not installed"
)


@pytest.fixture(scope="module")
def prometheus(app, tmp_path_factory) -> Iterator[str]:
    workdir: Path = tmp_path_factory.mktemp("prometheus")
    target = app.url.removeprefix("http://")
    (workdir / "prometheus.yml").write_text(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
        "scrape_configs:\n  - job_name: roundgate\n    metrics_path: /metrics\n"
        f"    static_configs:\n      - targets: ['{target}']\n"
    )
    port = free_port()
    log = workdir / "prometheus.log"
    proc = subprocess.Popen(
        [
            "prometheus",
            f"--config.file={workdir / 'prometheus.yml'}",
            f"--storage.tsdb.path={workdir / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=log.open("w"),
    )
    url = f"http://127.0.0.1:{port}"

    def ready() -> int | str:
        if proc.poll() is not None:
            pytest.fail(f"prometheus exited with {proc.returncode}: {log.read_text()[-2000:]}")
        return _ready(url)

    try:
        wait_for(
            ready,
            60,
            f"Prometheus at {url} to answer /-/ready with 200",
            until=lambda status: status == 200,
        )
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def _ready(url: str) -> int | str:
    try:
        return httpx.get(f"{url}/-/ready", timeout=2).status_code
    except httpx.HTTPError as exc:
        return repr(exc)


def query(url: str, expr: str) -> dict:
    r = httpx.get(f"{url}/api/v1/query", params={"query": expr}, timeout=10)
    body = r.json()
    assert body.get("status") == "success", (expr, body)
    return body["data"]


def scalar(url: str, expr: str) -> float:
    result = query(url, expr)["result"]
    return sum(float(v["value"][1]) for v in result)


def test_metrics_endpoint_is_promtool_clean(app) -> None:
    complete(app.url, prompt="warm", max_tokens=2)
    exposition: dict[str, str] = {}

    def missing() -> list[str]:
        exposition["text"] = text = httpx.get(f"{app.url}/metrics", timeout=10).text
        return [marker for marker in EXPOSITION_MARKERS if marker not in text]

    wait_for(missing, 30, f"/metrics to show {EXPOSITION_MARKERS} (missing ones)", until=_empty)
    text = exposition["text"]
    if shutil.which("promtool"):
        proc = subprocess.run(
            ["promtool", "check", "metrics"], input=text.encode(), capture_output=True, timeout=30
        )
        assert proc.returncode == 0, proc.stdout.decode() + proc.stderr.decode()
    # Every series once: no duplicate (name, labels) lines.
    samples = [line.split(" ")[0] for line in text.splitlines() if line and line[0] != "#"]
    assert len(samples) == len(set(samples))


EXPOSITION_MARKERS = ('dp_rank="0"', 'dp_rank="1"', "roundgate_request_ttft")


def _empty(items: list) -> bool:
    return not items


def _scrapes_since(url: str, since: float) -> dict[str, float]:
    """Per series of the prefill counter that the newest scrape still holds: samples in the
    last minute, and whether its newest was scraped after ``since`` (a wall-clock time). A
    series gone from the scrapes (a replaced replica's, from an earlier module) is left out:
    it keeps whatever count it had in the minute's window until the window passes it."""
    counts = {
        json.dumps(v["metric"], sort_keys=True): float(v["value"][1])
        for v in query(url, "count_over_time(roundgate_prefill_rounds_total[1m])")["result"]
    }
    stamps = {
        json.dumps(v["metric"], sort_keys=True): float(v["value"][1])
        for v in query(url, "timestamp(roundgate_prefill_rounds_total)")["result"]
    }
    return {
        "series": len(stamps),
        "min_samples": min((counts.get(k, 0.0) for k in stamps), default=0.0),
        "newest_after_start": bool(stamps) and min(stamps.values()) > since,
    }


def _baseline_ready(seen: dict[str, float]) -> bool:
    return seen["series"] > 0 and seen["min_samples"] >= 2 and bool(seen["newest_after_start"])


def test_prometheus_sees_the_gate_move_with_a_skewed_workload(app, prometheus) -> None:
    # The workload must start after Prometheus holds samples of the counters, or their
    # whole increase happens before its first scrape and rate() sees a flat line; and the
    # baseline read below must come from a scrape taken now, not from before earlier traffic.
    since = time.time()
    wait_for(
        lambda: _scrapes_since(prometheus, since),
        60,
        "two scrapes of roundgate_prefill_rounds_total, the newest after the test started",
        until=_baseline_ready,
    )
    base_any = scalar(prometheus, 'roundgate_gate_votes_total{point="any",outcome="open"}')
    decoder = BackgroundStream(
        app.url, prompt=[5, 6, 7], max_tokens=3000, ignore_eos=True, dp_rank=1
    )
    try:
        assert decoder.started.wait(60)
        for i in range(4):  # a lone backlog on rank 0: only ANY points can admit it
            complete(app.url, prompt=f"skewed {i}", max_tokens=2, dp_rank=0)
    finally:
        decoder.close()
    for i in range(4):  # both ranks idle-or-wanting: ALL points open
        complete(app.url, prompt=f"both {i}", max_tokens=2, dp_rank=i % 2)

    def counters() -> dict[str, float]:
        return {
            "prefill_rate": scalar(prometheus, "rate(roundgate_prefill_rounds_total[1m])"),
            "any_open": scalar(
                prometheus, 'roundgate_gate_votes_total{point="any",outcome="open"}'
            ),
            "all_open": scalar(
                prometheus, 'roundgate_gate_votes_total{point="all",outcome="open"}'
            ),
        }

    def moved(seen: dict[str, float]) -> bool:
        return seen["prefill_rate"] > 0 and seen["any_open"] > base_any and seen["all_open"] > 0

    try:
        wait_for(
            counters,
            60,
            f"prefill rate > 0, ANY-open votes above {base_any} and ALL-open votes > 0",
            until=moved,
            interval_s=1.0,
        )
    except WaitTimeout as exc:
        lines = [
            x
            for x in httpx.get(f"{app.url}/metrics", timeout=10).text.splitlines()
            if ("rounds_total" in x or "gate_votes" in x) and not x.startswith("#")
        ]
        pytest.fail(f"gate counters did not move as expected: {exc}; exposition: {lines}")


def test_every_dashboard_query_executes(app, prometheus) -> None:
    failures = []
    for title, expr in queries():
        r = httpx.get(f"{prometheus}/api/v1/query", params={"query": expr}, timeout=10).json()
        if r.get("status") != "success":
            failures.append((title, expr, r.get("error")))
    assert not failures, failures
