"""Dashboards: the committed JSON is current, and every query names real metrics and parses."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import Counter, Gauge, Histogram
from prometheus_client.metrics import MetricWrapperBase

from roundgate.actors.control.scheduler import PREFILL_WATERMARK
from roundgate.actors.telemetry.metrics import RankMetricSet, RequestMetricSet
from roundgate.dashboards import build, gate, serving
from roundgate.dashboards.build import queries
from roundgate.sim.regime_report import LOW_MIXED_FRACTION, LOW_WINDOW_S

DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
# Grafana 11.0-11.2 write schemaVersion 39, 11.3-11.5 write 40, 11.6 writes 41; the 10.x SDK
# builds write 36.
GRAFANA_11_SCHEMAS = range(39, 42)
SELECTOR = re.compile(r"\b(?P<name>roundgate_\w+)(?:\{(?P<matchers>[^}]*)\})?")
MATCHER = re.compile(r'(?P<label>\w+)\s*(?:=~|!~|!=|=)\s*"[^"]*"')
GROUPING = re.compile(r"\b(?:by|without)\s*\((?P<labels>[^)]*)\)")
SUFFIXES = {Counter: ("_total",), Gauge: ("",), Histogram: ("_bucket", "_sum", "_count")}


@cache
def boards() -> dict[str, dict[str, Any]]:
    return {name: json.loads(text) for name, text in build.render().items()}


def panels() -> list[tuple[str, dict[str, Any]]]:
    return [
        (name, panel)
        for name, board in boards().items()
        for panel in board["panels"]
        if panel["type"] != "row"
    ]


@cache
def series_labels() -> dict[str, frozenset[str]]:
    """Every sample name the metric sets can export -> its label names (``le`` on buckets)."""
    names: dict[str, frozenset[str]] = {}
    for metric_set in (RankMetricSet(), RequestMetricSet()):
        for metric in vars(metric_set).values():
            if not isinstance(metric, MetricWrapperBase):
                continue
            # prometheus_client keeps the base name (no _total) and label names privately.
            labels = frozenset(metric._labelnames)
            (kind,) = (k for k in SUFFIXES if isinstance(metric, k))
            for suffix in SUFFIXES[kind]:
                names[metric._name + suffix] = labels | ({"le"} if suffix == "_bucket" else set())
    return names


def test_committed_json_is_current() -> None:
    assert build.stale() == []
    assert build.main(["--check"]) == 0
    assert sorted(p.name for p in build.DIRECTORY.glob("*.json")) == sorted(build.BOARDS)


def test_check_flags_edited_missing_and_extra_files(tmp_path: Path) -> None:
    build.write(tmp_path)
    assert build.stale(tmp_path) == []
    gate_file, serving_file = (tmp_path / name for name in build.BOARDS)
    gate_file.write_text(gate_file.read_text().replace("Rounds since prefill", "Rounds"))
    serving_file.unlink()
    (tmp_path / "old.json").write_text("{}")
    assert build.stale(tmp_path) == sorted([gate_file.name, serving_file.name, "old.json"])
    build.write(tmp_path)
    assert build.stale(tmp_path) == []


def test_output_is_stable_and_sorted() -> None:
    first, second = build.render(), build.render()
    assert first == second
    for text in first.values():
        assert text == json.dumps(json.loads(text), indent=2, sort_keys=True) + "\n"


@pytest.mark.parametrize("name", sorted(build.BOARDS))
def test_schema_version_is_grafana_11(name: str) -> None:
    assert boards()[name]["schemaVersion"] in GRAFANA_11_SCHEMAS


def test_every_panel_and_target_reads_the_datasource_variable() -> None:
    for name, panel in panels():
        assert panel["datasource"] == DATASOURCE, (name, panel["title"])
        assert panel["targets"], (name, panel["title"])
        for target in panel["targets"]:
            assert target["datasource"] == DATASOURCE, (name, panel["title"])


def test_panel_ids_are_unique_per_dashboard() -> None:
    for board in boards().values():
        ids = [panel["id"] for panel in board["panels"]]
        assert ids == list(range(1, len(ids) + 1))


@pytest.mark.parametrize("name", sorted(build.BOARDS))
def test_variables(name: str) -> None:
    variables = {v["name"]: v for v in boards()[name]["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    for label in ("group", "dp_rank", "model"):
        variable = variables[label]
        assert variable["type"] == "query"
        assert variable["datasource"] == DATASOURCE
        assert build.LABEL_VALUES.match(variable["query"])["label"] == label
        assert variable["multi"] and variable["includeAll"]


def test_panels_use_the_group_and_rank_variables() -> None:
    exprs = " ".join(expr for _, expr in build.templated_queries())
    assert 'group=~"$group"' in exprs
    assert 'dp_rank=~"$dp_rank"' in exprs


def test_every_panel_selector_filters_by_each_variable_label_it_has() -> None:
    """A series with a group/dp_rank/model label is always narrowed by that variable."""
    for _, panel in panels():
        for target in panel["targets"]:
            for selector in SELECTOR.finditer(target["expr"]):
                matchers = selector["matchers"] or ""
                for label in series_labels()[selector["name"]] & {"group", "dp_rank", "model"}:
                    assert f'{label}=~"${label}"' in matchers, (panel["title"], selector[0])


def test_variables_narrow_each_other() -> None:
    """model, then group within the models, then dp_rank within the groups."""
    variables = {v["name"]: v["query"] for v in next(iter(boards().values()))["templating"]["list"]}
    assert "$" not in variables["model"]
    assert 'model=~"$model"' in variables["group"]
    assert 'group=~"$group"' in variables["dp_rank"]


def test_every_metric_name_exists_in_the_registries() -> None:
    for title, expr in queries():
        names = SELECTOR.findall(expr)
        assert names, (title, expr)
        for name, _ in names:
            assert name in series_labels(), (title, name)


def test_every_label_in_a_query_belongs_to_its_metrics() -> None:
    for title, expr in queries():
        known = frozenset().union(*(series_labels()[name] for name, _ in SELECTOR.findall(expr)))
        used = {m["label"] for s in SELECTOR.finditer(expr) for m in MATCHER.finditer(s[0])}
        for grouping in GROUPING.finditer(expr):
            used |= {label.strip() for label in grouping["labels"].split(",")}
        assert used <= known, (title, used - known)


def test_queries_cover_every_target_and_are_plain_promql() -> None:
    listed = queries()
    targets = sum(len(panel["targets"]) for _, panel in panels())
    variables = {v["name"] for b in boards().values() for v in b["templating"]["list"]}
    assert len(listed) == targets + len(variables - {"datasource"})
    assert len(set(listed)) == len(listed)
    for title, expr in listed:
        assert "$" not in expr, (title, expr)
    assert build.executable('x{a=~"$a", b=~"${b}"}[$__rate_interval]', "5m") == (
        'x{a=~".*", b=~".*"}[5m]'
    )


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed")
def test_every_query_parses_with_promtool(tmp_path: Path) -> None:
    rules = [
        {"record": f"roundgate:dashboard_query_{i}", "expr": expr}
        for i, (_, expr) in enumerate(queries())
    ]
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboards", "rules": rules}]}))
    result = subprocess.run(
        ["promtool", "check", "rules", str(path)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(rules)} rules found" in result.stdout


def test_kv_panel_draws_the_scheduler_watermark() -> None:
    assert serving.PREFILL_WATERMARK == PREFILL_WATERMARK
    (kv,) = (p for _, p in panels() if p["title"].startswith("KV occupancy"))
    defaults = kv["fieldConfig"]["defaults"]
    assert defaults["custom"]["thresholdsStyle"]["mode"] == "line"
    assert [s["value"] for s in defaults["thresholds"]["steps"]] == [None, PREFILL_WATERMARK]


def test_required_panels_exist() -> None:
    titles = {panel["title"] for _, panel in panels()}
    assert {
        "Prefill-round rate per group",
        "Decode-round fraction per group",
        "Gate votes by point and outcome",
        "Rounds since prefill",
        "Rank wants prefill / has decode work",
        "Admission wait",
        "Time to first token",
        "Inter-token latency",
        "End-to-end latency",
        f"KV occupancy vs the {PREFILL_WATERMARK} watermark",
        "Running and waiting requests per rank",
        "Round time breakdown by part",
        "MoE rounds: low-latency vs normal",
        "Finished requests by reason",
        "Token throughput",
        "Gate outcome per round",
        "Mixed share of prefill rounds",
        "Prefill windows per second",
        "Mean prefill window length",
        "Prefill progress spread",
        "Prefill progress per rank",
    } <= titles


def test_regime_panels_draw_the_regime_reports_low_thresholds() -> None:
    assert (gate.LOW_MIXED_FRACTION, gate.LOW_WINDOW_S) == (LOW_MIXED_FRACTION, LOW_WINDOW_S)
    lines = {
        p["title"]: [s["value"] for s in p["fieldConfig"]["defaults"]["thresholds"]["steps"]]
        for _, p in panels()
        if p["title"] in ("Mixed share of prefill rounds", "Mean prefill window length")
    }
    assert lines == {
        "Mixed share of prefill rounds": [None, LOW_MIXED_FRACTION],
        "Mean prefill window length": [None, LOW_WINDOW_S],
    }


def test_the_regime_series_are_on_the_gate_dashboard() -> None:
    """Every series the regime adds to /metrics has a panel (gate/outcome.py's readings)."""
    exprs = " ".join(
        t["expr"] for p in boards()["roundgate-gate.json"]["panels"] for t in p.get("targets", [])
    )
    for name in (
        "roundgate_gate_rounds_total",
        "roundgate_mixed_rounds_total",
        "roundgate_prefill_windows_total",
        "roundgate_prefill_progress_spread_chunks",
        "roundgate_prefill_progress_bins_total",
        "roundgate_prefill_progress_bin_spread_chunks_total",
        "roundgate_rank_prefill_tokens_total",
    ):
        assert name in series_labels(), name
        assert re.search(rf"\b{name}\b", exprs), name
