"""The ``roundgate`` command as a user runs it, and the routers no other test serves.

``roundgate serve`` (what ``make serve`` runs) runs as its own process, with its own Ray
cluster, in a process group of its own, on local.yaml as shipped (the default model, a GGUF
file) but for three settings, so that its one cluster start also serves two features no other
deployment runs: ``--gguf-weights int8-dot`` (each rank's ``roundgate_rank_weight_path``) and
the ``skewed`` router with all the weight on rank 1 (a zero weight makes the expectation
exact), on a free port. Its ready line, a request, then Ctrl-C to the whole group, as a
terminal sends it: no process under it or in its group may be left. Only that group and the
processes under serve are ever signalled or inspected: the session's cluster and any other
cluster on the machine are left alone.

While it starts (the module starts it first), the session's cluster runs the rest:

- ``roundgate bench``, in this process, open and closed loop against the shared deployment;
  its JSON report and table are read back;
- the ``least-loaded`` router on an application of its own beside the shared one (the shared
  config under another name and route prefix: a deploy and a delete, where redeploying the
  shared app would take a deploy and a restore). With a long stream pinned to rank 0, each
  new unpinned prompt, sent once the one before is answered, must be admitted on rank 1, the
  rank with less outstanding work; round-robin sends half of them to rank 0.

Where prompts went is read from ``/metrics``: each rank's admitted prompt tokens.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
import yaml
from helpers import BackgroundStream, complete, rank_prompt_tokens, wait_for
from prometheus_client.parser import text_string_to_metric_families

from roundgate.cli.main import main as roundgate
from roundgate.deployment.local import DEFAULT_CONFIG, load_config
from roundgate.kernels import quant

READY = "roundgate ready on "
SERVE_ARGS = {"gguf_weights": "int8-dot", "router": "skewed", "route_weights": [0, 1]}
STARTUP_S = 300.0  # imports, a Ray cluster and two ranks on a shared two-core machine
STOP_S = 60.0  # serve.shutdown's bound (20 s) and ray.shutdown, with room


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServedCli:
    """``roundgate serve --config CONFIG`` in a process group of its own; stdout is read in a
    thread (Ray forwards its workers' output there, so the pipe must never fill)."""

    def __init__(self, config: Path, url: str, stderr: Path) -> None:
        self.url, self.stderr_path = url, stderr
        self.lines: list[str] = []
        self.prompt_tokens = 0  # prompt tokens of every request the tests sent it
        self.tree: set[tuple[int, float]] = set()  # the processes last seen under it
        env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}  # its own cluster
        command = [str(Path(sys.executable).with_name("roundgate")), "serve", "--config"]
        with stderr.open("w") as err:
            self.process = subprocess.Popen(
                [*command, str(config)],
                stdout=subprocess.PIPE,
                stderr=err,
                text=True,
                env=env,
                start_new_session=True,  # a process group of its own, as a terminal's job
            )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append(line.rstrip("\n"))

    def ready_line(self) -> str:
        """The ready line, once printed; fails at once with its stderr if serve exits first."""

        def seen() -> str | None:
            ready = [line for line in self.lines if line.startswith(READY)]
            if not ready and self.process.poll() is not None:
                raise AssertionError(f"serve exited ({self.process.returncode}): {self.stderr()}")
            return ready[0] if ready else None

        return wait_for(seen, STARTUP_S, "serve's ready line", interval_s=0.2)

    def stderr(self) -> str:
        return self.stderr_path.read_text()[-4000:]

    def complete(self, **body: Any) -> dict[str, Any]:
        r = httpx.post(f"{self.url}/v1/completions", json=body, timeout=120)
        assert r.status_code == 200, r.text
        answer = r.json()
        self.prompt_tokens += answer["usage"]["prompt_tokens"]
        return answer

    def process_tree(self) -> set[tuple[int, float]]:
        """(pid, start time) of serve and every process under it (Ray's daemons, workers)."""
        root = psutil.Process(self.process.pid)
        self.tree = {(p.pid, p.create_time()) for p in [root, *root.children(recursive=True)]}
        return self.tree

    def left_behind(self) -> list[psutil.Process]:
        """Processes of the last tree seen, or of serve's process group, still running
        (a zombie is gone: only its exit status is left)."""
        left = []
        for p in psutil.process_iter(["create_time", "status"]):
            try:
                ours = (p.pid, p.info["create_time"]) in self.tree
                ours = ours or os.getpgid(p.pid) == self.process.pid
            except ProcessLookupError:
                continue
            if ours and p.info["status"] != psutil.STATUS_ZOMBIE:
                left.append(p)
        return left

    def kill(self) -> None:
        """After a failed test only: serve and what it left, by their ids."""
        if self.process.poll() is None:
            self.process_tree()
        for p in self.left_behind():
            with contextlib.suppress(psutil.NoSuchProcess):
                p.kill()
        self.process.wait(30)


def describe(process: psutil.Process) -> str:
    with contextlib.suppress(psutil.NoSuchProcess):
        return f"{process.pid}: {' '.join(process.cmdline())[:160]}"
    return f"{process.pid}: (exited)"


@pytest.fixture(scope="module", autouse=True)
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServedCli]:
    """``roundgate serve`` on local.yaml with ``SERVE_ARGS`` and a free port, started as the
    module starts, so that it boots while the tests on the session's cluster run; stopped
    with Ctrl-C by the last test (killed here if that test failed)."""
    cfg = load_config(DEFAULT_CONFIG)
    port = free_port()
    cfg["http_options"]["port"] = port
    cfg["applications"][0]["args"].update(SERVE_ARGS)
    folder = tmp_path_factory.mktemp("served-cli")
    config = folder / "local-int8-skewed.yaml"
    config.write_text(yaml.safe_dump(cfg))
    server = ServedCli(config, f"http://127.0.0.1:{port}", folder / "serve.stderr")
    yield server
    if server.process.poll() is None or server.left_behind():
        server.kill()


# Six requests of fixed lengths (8 prompt, 8 output tokens): the report's sums are exact.
BENCH_LOAD = ["--num-requests", "6", "--input-len", "8", "--output-len", "8", "--length-dist"]
BENCH_LOAD += ["fixed", "--no-progress"]


@pytest.mark.parametrize(
    ("loop", "flags"),
    [("open", ["--arrival", "poisson", "--rate", "20"]), ("closed", ["--concurrency", "2"])],
)
def test_bench_reports_every_request_it_sent(
    app: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str], loop: str, flags: list[str]
) -> None:
    """Open loop (seeded Poisson arrivals) and closed loop (two workers): every request
    completed with its tokens, each latency measured, the rates their own quotients."""
    report_path = tmp_path / "bench.json"
    argv = ["bench", "--url", app.url, *BENCH_LOAD, *flags, "--json", str(report_path)]
    assert roundgate(argv) == 0
    report = json.loads(report_path.read_text())
    result, workload = report["results"]["bench"], report["workload"]
    requests, output_len = workload["num_requests"], workload["output_len"]
    assert (workload["concurrency"] is None) == (loop == "open")
    assert result["requests"] == result["completed"] == requests
    assert result["errors"] == {}
    # Each answer's usage said output_len tokens.
    duration = result["duration_s"]
    assert duration > 0
    assert result["output_tokens_per_s"] == pytest.approx(requests * output_len / duration, 0.01)
    assert result["request_throughput"] == pytest.approx(requests / duration, 0.01)
    for name in ("ttft_ms", "itl_ms", "tpot_ms", "e2e_ms"):
        p = result[name]
        assert 0 < p["p50"] <= p["p90"] <= p["p99"], (name, p)
    # Every request ends after its first token, so each percentile of e2e is past TTFT's.
    assert all(result["e2e_ms"][k] >= result["ttft_ms"][k] for k in ("p50", "p90", "p99"))
    row = capsys.readouterr().out.splitlines()[1].split()  # the table's one run
    assert row[:3] == ["bench", str(requests), "0"], row  # run, done, errors


APP = "least-loaded-router"
RANKS = (0, 1)
# Two streams, so rank 0's load (2) stays above anything rank 1's lagging report can show.
BUSY_STREAMS = 2
LONG_PROMPT = list(range(100, 164))
SHORT_PROMPTS = [list(range(300 + 10 * i, 308 + 10 * i)) for i in range(4)]


class SideApp:
    """An application beside the shared one: its URL and its rank replicas' handle."""

    def __init__(self, cfg: dict[str, Any], **overrides: Any) -> None:
        from ray import serve

        from roundgate.deployment.local import config_url, deploy, wait_ready

        cfg = copy.deepcopy(cfg)
        cfg["applications"][0].update(name=APP, route_prefix=f"/{APP}")
        self.url = f"{config_url(cfg)}/{APP}"
        deploy(cfg, overrides)
        wait_ready(self.url)
        self.ranks = serve.get_deployment_handle("RankReplica", app_name=APP)

    def stats(self, rank: int) -> dict[str, Any]:
        from roundgate.actors.control.messages import RankTarget

        return self.ranks.stats_snapshot.remote(RankTarget(rank)).result(timeout_s=30)


@pytest.fixture
def least_loaded(ray_cluster: None, local_config: dict[str, Any]) -> Iterator[SideApp]:
    """Deleted as soon as its one test ends: while serve is still starting."""
    from ray import serve

    side = SideApp(local_config, router="least-loaded")
    yield side
    serve.delete(APP)


def test_least_loaded_sends_new_prompts_to_the_rank_without_work(least_loaded: SideApp) -> None:
    """Rank 0 holds two long streams; rank 1 at most the one prompt before (whose report may
    still count it after its answer): each new prompt must go to rank 1."""
    dep = least_loaded
    (gang,) = {dep.stats(r)["gang_id"] for r in RANKS}
    # The ranks' own counts: exact now (nothing in flight), where /metrics may lag a push.
    before = {r: dep.stats(r)["prefix_queries"] for r in RANKS}
    busy = [
        BackgroundStream(
            dep.url, prompt=LONG_PROMPT, max_tokens=3000, ignore_eos=True, temperature=0, dp_rank=0
        )
        for _ in range(BUSY_STREAMS)
    ]
    try:
        assert all(stream.started.wait(120) for stream in busy)
        for prompt in SHORT_PROMPTS:  # one at a time
            complete(dep.url, prompt=prompt, max_tokens=1)
        assert not any(s.done.is_set() for s in busy), "a stream on rank 0 ended too soon"
    finally:
        for stream in busy:
            stream.close()
    short = sum(map(len, SHORT_PROMPTS))
    total = sum(before.values()) + BUSY_STREAMS * len(LONG_PROMPT) + short
    after = wait_for(
        lambda: rank_prompt_tokens(dep.url, gang),
        30,
        f"{total} prompt tokens in the gang's /metrics",
        until=lambda tokens: sum(tokens.values()) == total,
    )
    moved = {r: after.get(r, 0) - before[r] for r in RANKS}
    assert moved == {0: BUSY_STREAMS * len(LONG_PROMPT), 1: short}, moved


def test_serve_prints_its_ready_line_and_answers(served: ServedCli) -> None:
    line = served.ready_line()
    assert line.split()[3] == served.url, line  # "roundgate ready on URL  (Ctrl-C to stop)"
    # What the ready line's own curl example sends (ignore_eos: exactly max_tokens).
    answer = served.complete(prompt="Hello", max_tokens=16, ignore_eos=True)
    assert answer["choices"][0]["finish_reason"] == "length"
    assert answer["usage"]["completion_tokens"] == 16


def weight_paths(url: str) -> dict[int, list[str]]:
    """Each rank's weight paths at 1 in ``/metrics``."""
    text = httpx.get(f"{url}/metrics", timeout=30).raise_for_status().text
    paths: dict[int, list[str]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "roundgate_rank_weight_path" and s.value == 1:
                paths.setdefault(int(s.labels["dp_rank"]), []).append(s.labels["path"])
    return paths


@pytest.mark.skipif(not quant.cpu_supports_kernel(), reason="int8-dot needs AVX2/FMA/F16C")
def test_int8_dot_ranks_report_their_weight_path(served: ServedCli) -> None:
    served.ready_line()
    paths = wait_for(
        lambda: weight_paths(served.url),
        30,
        "both ranks' weight path in /metrics",
        until=lambda seen: set(seen) == {0, 1},
    )
    assert paths == {0: ["int8-dot"], 1: ["int8-dot"]}


def test_skewed_router_lands_every_prompt_on_the_weighted_rank(served: ServedCli) -> None:
    """Weights 0,1: every unpinned prompt admitted on rank 1 (round-robin, or draws that
    ignore the weights, put about half of them on rank 0)."""
    served.ready_line()
    # What the module sent before, once the ranks' counts reached /metrics.
    before = wait_for(
        lambda: rank_prompt_tokens(served.url),
        30,
        "the earlier requests' prompt tokens in /metrics",
        until=lambda tokens: sum(tokens.values()) == served.prompt_tokens,
    )
    prompts = [list(range(10 * i + 1, 10 * i + 9)) for i in range(6)]
    for prompt in prompts:
        served.complete(prompt=prompt, max_tokens=2)
    sent = sum(map(len, prompts))
    after = wait_for(
        lambda: rank_prompt_tokens(served.url),
        30,
        f"{sent} more prompt tokens in /metrics",
        until=lambda tokens: sum(tokens.values()) == served.prompt_tokens,
    )
    moved = {rank: after.get(rank, 0) - before.get(rank, 0) for rank in (0, 1)}
    assert moved == {0: 0, 1: sent}, moved


def test_ctrl_c_leaves_no_process_behind(served: ServedCli) -> None:
    """The module's last test: it stops the module's server."""
    served.ready_line()
    assert len(served.process_tree()) > 2, served.tree  # serve, Ray's daemons, workers
    os.killpg(served.process.pid, signal.SIGINT)  # what Ctrl-C in its terminal sends
    assert served.process.wait(STOP_S) == 0, served.stderr()
    assert "roundgate: shutting down" in served.stderr()
    wait_for(
        lambda: [describe(p) for p in served.left_behind()],
        30,
        "every process under serve, or in its group, to exit",
        until=lambda left: not left,
    )
