"""Helpers behind the manifest tests and the dashboards ConfigMap generator."""
