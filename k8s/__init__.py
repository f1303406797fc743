"""Offline tooling for the KubeRay manifests: render, validate, generate (no kubectl here)."""
