"""Shared pieces of the dashboards: the datasource, the template variables, panel builders.

Every panel and every target reads from the ``${datasource}`` variable, so one dashboard file
works against whichever Prometheus the Grafana instance has. Label filters use the regex
matchers Grafana expects for multi-value variables (``group=~"$group"``); "All" maps to ``.*``.
"""

from __future__ import annotations

from collections.abc import Sequence

from grafana_foundation_sdk.builders import common as cb
from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.builders import prometheus, statetimeline, timeseries
from grafana_foundation_sdk.models import common as cm
from grafana_foundation_sdk.models import dashboard as dm

DATASOURCE = dm.DataSourceRef(type_val="prometheus", uid="${datasource}")
RATE = "$__rate_interval"
# Label filters by the series' label sets (actors/telemetry/metrics.py: GROUP, RANK, and the
# request metrics).
MODEL = 'model=~"$model"'
GROUP = f'group=~"$group", {MODEL}'
RANK = f'{GROUP}, dp_rank=~"$dp_rank"'
PERCENTILES = (0.5, 0.9, 0.99)
REF_IDS = "ABCDEFGHIJ"

# Each target is one PromQL expression and its legend.
Target = tuple[str, str]
Panel = timeseries.Panel | statetimeline.Panel


def _label_values(label: str, selector: str) -> db.QueryVariable:
    """A multi-value variable named ``label``: its values on ``selector`` ("All" is ``.*``)."""
    return (
        db.QueryVariable(label)
        .label(label)
        .datasource(DATASOURCE)
        .query(f"label_values({selector}, {label})")
        .refresh(dm.VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(dm.VariableSort.NATURAL_ASC)
        .multi(True)
        .include_all(True)
        .all_value(".*")
    )


def variables() -> list[db.DatasourceVariable | db.QueryVariable]:
    """``datasource``, then ``model``, ``group`` and ``dp_rank``, each within the ones before."""
    return [
        db.DatasourceVariable("datasource").label("Prometheus").type("prometheus"),
        _label_values("model", "roundgate_group_rounds_total"),
        _label_values("group", f"roundgate_group_rounds_total{{{MODEL}}}"),
        _label_values("dp_rank", f"roundgate_rank_running_requests{{{GROUP}}}"),
    ]


def _targets(targets: Sequence[Target]) -> list[prometheus.Dataquery]:
    return [
        prometheus.Dataquery()
        .datasource(DATASOURCE)
        .ref_id(REF_IDS[i])
        .expr(expr)
        .legend_format(legend)
        .range()
        for i, (expr, legend) in enumerate(targets)
    ]


def rate(metric: str, labels: str, by: str) -> str:
    """Per-second rate of a counter, summed ``by`` the given labels."""
    return f"sum by ({by}) (rate({metric}{{{labels}}}[{RATE}]))"


def percentiles(histogram: str, labels: str, by: str = "") -> list[Target]:
    """p50/p90/p99 of a histogram family (``histogram`` without ``_bucket``)."""
    keep = f"{by}, le" if by else "le"
    prefix = f"{{{{{by}}}}} " if by else ""
    return [
        (
            f"histogram_quantile({q}, {rate(f'{histogram}_bucket', labels, keep)})",
            f"{prefix}p{round(q * 100)}",
        )
        for q in PERCENTILES
    ]


def graph(
    title: str,
    description: str,
    targets: Sequence[Target],
    *,
    unit: str = "short",
    stacked: bool = False,
    width: int = 12,
) -> timeseries.Panel:
    """A time series panel over ``targets``, legend as a table with last and max."""
    panel = (
        timeseries.Panel()
        .title(title)
        .description(description)
        .datasource(DATASOURCE)
        .targets(_targets(targets))
        .unit(unit)
        .span(width)
        .height(8)
        .fill_opacity(10)
        .legend(
            cb.VizLegendOptions()
            .show_legend(True)
            .display_mode(cm.LegendDisplayMode.TABLE)
            .placement(cm.LegendPlacement.BOTTOM)
            .calcs(["lastNotNull", "max"])
        )
        .tooltip(
            cb.VizTooltipOptions().mode(cm.TooltipDisplayMode.MULTI).sort(cm.SortOrder.DESCENDING)
        )
    )
    if stacked:
        panel = panel.stacking(cb.StackingConfig().mode(cm.StackingMode.NORMAL)).fill_opacity(60)
    return panel


def ratio_graph(title: str, description: str, targets: Sequence[Target]) -> timeseries.Panel:
    """A time series of 0..1 ratios, shown as percent."""
    return graph(title, description, targets, unit="percentunit").min(0).max(1)


def threshold_line(panel: timeseries.Panel, value: float) -> timeseries.Panel:
    """``panel`` with a red threshold line at ``value`` (green below it)."""
    steps = [dm.Threshold(value=None, color="green"), dm.Threshold(value=value, color="red")]
    return panel.thresholds(
        db.ThresholdsConfig().mode(dm.ThresholdsMode.ABSOLUTE).steps(steps)
    ).thresholds_style(cb.GraphThresholdsStyleConfig().mode(cm.GraphThresholdsStyleMode.LINE))


def watermark_graph(
    title: str, description: str, targets: Sequence[Target], watermark: float
) -> timeseries.Panel:
    """A 0..1 ratio graph with a red threshold line at ``watermark``."""
    return threshold_line(ratio_graph(title, description, targets), watermark)


def state_timeline(
    title: str, description: str, targets: Sequence[Target], states: Sequence[tuple[str, str]]
) -> statetimeline.Panel:
    """A state timeline of small integer codes; ``states[i]`` is the (text, color) of code i."""
    mappings = {
        str(code): dm.ValueMappingResult(text=text, color=color, index=code)
        for code, (text, color) in enumerate(states)
    }
    return (
        statetimeline.Panel()
        .title(title)
        .description(description)
        .datasource(DATASOURCE)
        .targets(_targets(targets))
        .mappings([dm.ValueMap(options=mappings)])
        .show_value(cm.VisibilityMode.NEVER)
        .merge_values(True)
        .row_height(0.8)
        .span(24)
        .height(10)
    )


def dashboard(
    uid: str, title: str, description: str, rows: Sequence[tuple[str, Sequence[Panel]]]
) -> db.Dashboard:
    """A roundgate dashboard of titled rows: variables, last hour, crosshair, sibling links."""
    board = (
        db.Dashboard(title)
        .uid(uid)
        .description(description)
        .tags(["roundgate"])
        .time("now-1h", "now")
        .refresh("30s")
        .timezone("browser")
        .tooltip(dm.DashboardCursorSync.CROSSHAIR)
        .variables(variables())
        .link(
            db.DashboardLink("roundgate")
            .type(dm.DashboardLinkType.DASHBOARDS)
            .tags(["roundgate"])
            .as_dropdown(True)
            .include_vars(True)
            .keep_time(True)
        )
    )
    for row_title, panels in rows:
        board = board.with_row(db.Row(row_title))
        for panel in panels:
            board = board.with_panel(panel)
    return board
