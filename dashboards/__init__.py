"""Grafana dashboards as code (grafana-foundation-sdk) and their generated JSON."""

from roundgate.dashboards.build import queries

__all__ = ["queries"]
