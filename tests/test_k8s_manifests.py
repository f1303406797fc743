"""Every rendered manifest under k8s/ validated offline, as the API server would see it.

Custom resources go against the KubeRay v1.7.0 CRDs (strict: unknown fields fail): the full ones
in ../shared/kuberay-crds when present, else (and always, in a second test) the repo's pruned
subset in tests/data/kuberay-crds; serveConfigV2 against Ray's ServeDeploySchema plus a typo
check, core objects through kubernetes-validate --strict, the PodMonitor through a bundled
schema subset.
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
from shared_data import DATA, shared_dir

from roundgate.k8s.tools.crd_schema import CrdValidator, load_crd
from roundgate.k8s.tools.crd_subset import subset_text
from roundgate.k8s.tools.podmonitor_schema import PODMONITOR_SCHEMA
from roundgate.k8s.tools.render import load_documents, render
from roundgate.k8s.tools.serve_config import check_serve_config

REPO = Path(__file__).resolve().parents[1]
K8S = REPO / "k8s"
SHARED_CRDS = shared_dir("kuberay-crds")
SUBSET_CRDS = DATA / "kuberay-crds"
CRDS = SHARED_CRDS or SUBSET_CRDS  # never skipped: the subset ships with the repo
K8S_VERSION = "1.33.0"
CRD_FILES = {
    "RayService": "ray.io_rayservices.yaml",
    "RayJob": "ray.io_rayjobs.yaml",
    "RayCluster": "ray.io_rayclusters.yaml",
}
CORE_KINDS = {"Job", "ConfigMap", "PersistentVolumeClaim", "Service", "Secret", "NetworkPolicy"}
KUSTOMIZATIONS = sorted(
    p.parent.relative_to(K8S).as_posix() for p in K8S.rglob("kustomization.yaml")
)
DNS_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


@cache
def rendered(directory: str) -> tuple[dict[str, Any], ...]:
    return tuple(render(K8S / directory))


def objects_of(kinds: set[str]) -> list[tuple[str, dict[str, Any]]]:
    return [(d, obj) for d in KUSTOMIZATIONS for obj in rendered(d) if obj["kind"] in kinds]


def object_id(pair: tuple[str, dict[str, Any]]) -> str:
    directory, obj = pair
    return f"{directory}:{obj['kind']}/{obj['metadata']['name']}"


@pytest.fixture(scope="session")
def crd_validators() -> dict[str, CrdValidator]:
    return {kind: CrdValidator(load_crd(CRDS / name)) for kind, name in CRD_FILES.items()}


def test_layout_has_the_expected_kustomizations() -> None:
    assert {"base/serve", "base/preflight", "base/bench", "base/experiment"} <= set(KUSTOMIZATIONS)
    assert any(d.startswith("overlays/") for d in KUSTOMIZATIONS)


@pytest.mark.parametrize("directory", KUSTOMIZATIONS)
def test_every_object_has_a_known_kind_and_a_dns_name(directory: str) -> None:
    objects = rendered(directory)
    assert objects
    for obj in objects:
        assert obj["kind"] in set(CRD_FILES) | CORE_KINDS | {"PodMonitor"}, obj["kind"]
        name = obj["metadata"]["name"]
        assert DNS_LABEL.match(name) and len(name) <= 50, name  # KubeRay derives longer names


@pytest.mark.parametrize("pair", objects_of(set(CRD_FILES)), ids=object_id)
def test_custom_resources_pass_the_kuberay_crds(
    pair: tuple[str, dict[str, Any]], crd_validators: dict[str, CrdValidator]
) -> None:
    _, obj = pair
    validator = crd_validators[obj["kind"]]
    assert validator.errors(obj, strict=False) == []
    assert validator.errors(obj, strict=True) == []


@pytest.mark.parametrize("pair", objects_of(set(CRD_FILES)), ids=object_id)
def test_custom_resources_pass_the_repo_crd_subset(pair: tuple[str, dict[str, Any]]) -> None:
    _, obj = pair
    validator = CrdValidator(load_crd(SUBSET_CRDS / CRD_FILES[obj["kind"]]))
    assert validator.errors(obj, strict=True) == []


@pytest.mark.skipif(SHARED_CRDS is None, reason="../shared/kuberay-crds absent (the full CRDs)")
@pytest.mark.parametrize("name", sorted(CRD_FILES.values()))
def test_the_repo_crd_subset_is_current(name: str) -> None:
    """Rerun ``python -m k8s.tools.crd_subset ../shared/kuberay-crds tests/data/kuberay-crds``
    when this fails: a manifest now uses a schema level the subset cut."""
    assert SHARED_CRDS is not None
    objects = [obj for d in KUSTOMIZATIONS for obj in rendered(d)]
    expected = subset_text(load_crd(SHARED_CRDS / name), objects, name)
    assert (SUBSET_CRDS / name).read_text(encoding="utf-8") == expected


@pytest.mark.parametrize("pair", objects_of({"RayService"}), ids=object_id)
def test_serve_config_is_valid_and_has_no_typos(pair: tuple[str, dict[str, Any]]) -> None:
    _, obj = pair
    assert check_serve_config(obj["spec"]["serveConfigV2"]) == []


@pytest.mark.parametrize("pair", objects_of(CORE_KINDS), ids=object_id)
def test_core_objects_pass_kubernetes_validate_strict(pair: tuple[str, dict[str, Any]]) -> None:
    _, obj = pair
    kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


@pytest.mark.parametrize("pair", objects_of({"PodMonitor"}), ids=object_id)
def test_podmonitor_passes_the_bundled_schema(pair: tuple[str, dict[str, Any]]) -> None:
    _, obj = pair
    jsonschema.Draft7Validator(PODMONITOR_SCHEMA).validate(obj)


@pytest.mark.parametrize(
    "path", sorted(p.relative_to(K8S).as_posix() for p in K8S.rglob("*.yaml")), ids=str
)
def test_every_yaml_file_is_documented_at_the_top(path: str) -> None:
    first = (K8S / path).read_text(encoding="utf-8").lstrip().splitlines()[0]
    assert first.startswith("# "), f"{path} must open with a comment saying what it is"


@pytest.mark.parametrize("directory", KUSTOMIZATIONS)
def test_every_yaml_beside_a_kustomization_is_used(directory: str) -> None:
    (kustomization,) = load_documents(K8S / directory / "kustomization.yaml")
    used = set(kustomization.get("resources", []))
    used |= {p["path"] for p in kustomization.get("patches", []) if "path" in p}
    files = {p.name for p in (K8S / directory).glob("*.yaml")} - {"kustomization.yaml"}
    assert files <= used, f"unused in {directory}: {sorted(files - used)}"
