"""A real Prometheus scrapes the local deployment; the gate's counters move as the workload
implies, and every PromQL expression of every dashboard panel executes successfully."""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from actors.replica.rendezvous import free_port
from dashboards import queries
from tests.integration.helpers import BackgroundStream, complete, wait_until

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
    proc = subprocess.Popen(
        [
            "prometheus",
            f"--config.file={workdir / 'prometheus.yml'}",
            f"--storage.tsdb.path={workdir / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=(workdir / "prometheus.log").open("w"),
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: _ready(url), timeout_s=30)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def _ready(url: str) -> bool:
    try:
        return httpx.get(f"{url}/-/ready", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


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
    text = wait_until(lambda: _exposition_with_ranks(app.url), timeout_s=30)
    if shutil.which("promtool"):
        proc = subprocess.run(
            ["promtool", "check", "metrics"], input=text.encode(), capture_output=True, timeout=30
        )
        assert proc.returncode == 0, proc.stdout.decode() + proc.stderr.decode()
    # Every series once: no duplicate (name, labels) lines.
    samples = [line.split(" ")[0] for line in text.splitlines() if line and line[0] != "#"]
    assert len(samples) == len(set(samples))


def _exposition_with_ranks(url: str) -> str | None:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    ok = 'dp_rank="0"' in text and 'dp_rank="1"' in text and "roundgate_request_ttft" in text
    return text if ok else None


def test_prometheus_sees_the_gate_move_with_a_skewed_workload(app, prometheus) -> None:
    # The workload must start after Prometheus holds samples of the counters, or their
    # whole increase happens before its first scrape and rate() sees a flat line.
    wait_until(
        lambda: query(prometheus, "roundgate_prefill_rounds_total")["result"],
        timeout_s=60,
        interval_s=0.5,
    )
    time.sleep(2)
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
    time.sleep(4)  # a few scrapes

    seen: dict[str, float] = {}

    def moved() -> bool:
        seen["prefill_rate"] = scalar(prometheus, "rate(roundgate_prefill_rounds_total[1m])")
        seen["any_open"] = scalar(
            prometheus, 'roundgate_gate_votes_total{point="any",outcome="open"}'
        )
        seen["all_open"] = scalar(
            prometheus, 'roundgate_gate_votes_total{point="all",outcome="open"}'
        )
        return seen["prefill_rate"] > 0 and seen["any_open"] > base_any and seen["all_open"] > 0

    try:
        wait_until(moved, timeout_s=30, interval_s=1.0)
    except TimeoutError:
        lines = [
            x
            for x in httpx.get(f"{app.url}/metrics", timeout=10).text.splitlines()
            if "rounds_total" in x and not x.startswith("#")
        ]
        pytest.fail(
            f"gate counters did not move as expected: {seen}, any before {base_any}; "
            f"exposition: {lines}"
        )


def test_every_dashboard_query_executes(app, prometheus) -> None:
    failures = []
    for title, expr in queries():
        r = httpx.get(f"{prometheus}/api/v1/query", params={"query": expr}, timeout=10).json()
        if r.get("status") != "success":
            failures.append((title, expr, r.get("error")))
    assert not failures, failures
