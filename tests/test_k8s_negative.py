"""Deliberately broken copies of the manifests fail validation, naming the path; the renderer's
JSON6902 and image handling behave like kustomize's.

The RayService cases run against the full KubeRay CRD in ../shared when present and always
against the repo's pruned subset (tests/data/kuberay-crds), which must refuse the same."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from shared_data import DATA, shared_dir

from roundgate.k8s.tools.crd_schema import PRESERVE, CrdValidator, load_crd, prepare, to_json_schema
from roundgate.k8s.tools.podmonitor_schema import PODMONITOR_SCHEMA
from roundgate.k8s.tools.render import apply_operation, render
from roundgate.k8s.tools.serve_config import check_serve_config

REPO = Path(__file__).resolve().parents[1]
SHARED_CRDS = shared_dir("kuberay-crds")
CRD_DIRS = [
    pytest.param(DATA / "kuberay-crds", id="repo-subset"),
    pytest.param(
        SHARED_CRDS,
        id="shared-full",
        marks=pytest.mark.skipif(SHARED_CRDS is None, reason="../shared/kuberay-crds absent"),
    ),
]
WORKER = "spec.rayClusterConfig.workerGroupSpecs[0]"


@pytest.fixture(scope="module", params=CRD_DIRS)
def service_validator(request: pytest.FixtureRequest) -> CrdValidator:
    return CrdValidator(load_crd(request.param / "ray.io_rayservices.yaml"))


@pytest.fixture()
def service() -> dict[str, Any]:
    (obj,) = [o for o in render(REPO / "k8s" / "base" / "serve") if o["kind"] == "RayService"]
    return copy.deepcopy(obj)


def edit(obj: dict[str, Any], *ops: dict[str, Any]) -> dict[str, Any]:
    for op in ops:
        apply_operation(obj, op)
    return obj


WORKER_PATH = "/spec/rayClusterConfig/workerGroupSpecs/0"
CONTAINER_PATH = f"{WORKER_PATH}/template/spec/containers/0"


@pytest.mark.parametrize(
    ("ops", "strict_error", "lenient_error"),
    [
        (  # a misspelled serveConfigV2 is just an unknown field to the API server
            [
                {"op": "add", "path": "/spec/serveConfigv2", "value": "x"},
                {"op": "remove", "path": "/spec/serveConfigV2"},
            ],
            "spec.serveConfigv2: unknown field",
            None,
        ),
        (
            [{"op": "add", "path": f"{CONTAINER_PATH}/imagePullPolicyy", "value": "Always"}],
            f"{WORKER}.template.spec.containers[0].imagePullPolicyy: unknown field",
            None,
        ),
        (
            [{"op": "replace", "path": f"{WORKER_PATH}/replicas", "value": "2"}],
            f"{WORKER}.replicas: '2' is not of type 'integer'",
            f"{WORKER}.replicas: '2' is not of type 'integer'",
        ),
        (
            [{"op": "remove", "path": "/spec/rayClusterConfig/headGroupSpec"}],
            "spec.rayClusterConfig: 'headGroupSpec' is a required property",
            "spec.rayClusterConfig: 'headGroupSpec' is a required property",
        ),
    ],
)
def test_broken_rayservice_fails_naming_the_path(
    service: dict[str, Any],
    service_validator: CrdValidator,
    ops: list[dict[str, Any]],
    strict_error: str,
    lenient_error: str | None,
) -> None:
    broken = edit(service, *ops)
    assert strict_error in service_validator.errors(broken, strict=True)
    lenient = service_validator.errors(broken, strict=False)
    assert lenient == ([lenient_error] if lenient_error else [])


def closed_levels(value: Any, schema: dict[str, Any], path: str = "") -> list[str]:
    """Dotted paths (``format_path`` style) of every mapping in ``value`` whose schema lists its
    properties and does not preserve unknown fields: where strict validation refuses a typo."""
    found = []
    if isinstance(value, dict):
        props = schema.get("properties")
        if props is not None and not schema.get(PRESERVE):
            found.append(path)
        for key, item in value.items():
            sub = (props or {}).get(key)
            if isinstance(sub, dict):
                found += closed_levels(item, sub, f"{path}.{key}" if path else key)
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for index, item in enumerate(value):
            found += closed_levels(item, schema["items"], f"{path}[{index}]")
    return found


def test_an_unknown_field_is_refused_at_every_level_the_manifest_uses(
    service: dict[str, Any], service_validator: CrdValidator
) -> None:
    levels = closed_levels(service, service_validator.schema)
    assert len(levels) > 20 and "spec.rayClusterConfig.headGroupSpec.template.spec" in levels
    for level in levels:
        broken = copy.deepcopy(service)
        target: Any = broken
        for part in level.replace("[", ".[").split(".") if level else []:
            target = target[int(part[1:-1])] if part.startswith("[") else target[part]
        target["zzTypo"] = 1
        where = f"{level or '<root>'}.zzTypo"
        assert service_validator.errors(broken, strict=True) == [f"{where}: unknown field"]


@pytest.mark.skipif(SHARED_CRDS is None, reason="../shared/kuberay-crds absent")
def test_the_subset_closes_the_same_levels_as_the_full_crd(service: dict[str, Any]) -> None:
    assert SHARED_CRDS is not None
    full, subset = (
        CrdValidator(load_crd(d / "ray.io_rayservices.yaml"))
        for d in (SHARED_CRDS, DATA / "kuberay-crds")
    )
    assert closed_levels(service, subset.schema) == closed_levels(service, full.schema)


def test_required_fields_with_defaults_are_defaulted(
    service: dict[str, Any], service_validator: CrdValidator
) -> None:
    edit(
        service,
        {"op": "remove", "path": f"{WORKER_PATH}/minReplicas"},
        {"op": "remove", "path": f"{WORKER_PATH}/maxReplicas"},
    )
    assert service_validator.errors(service) == []
    raw = jsonschema.Draft7Validator(to_json_schema(service_validator.schema, strict=False))
    assert not raw.is_valid(service)  # without the API server's defaulting it would fail
    assert (
        prepare(service, service_validator.schema)["spec"]["rayClusterConfig"]["workerGroupSpecs"][
            0
        ]["minReplicas"]
        == 0
    )


def test_nulls_are_pruned(service: dict[str, Any], service_validator: CrdValidator) -> None:
    edit(service, {"op": "add", "path": "/spec/suspend", "value": None})
    assert service_validator.errors(service) == []


@pytest.mark.parametrize(
    ("old", "new", "problem"),
    [
        ("import_path:", "import_pth:", "applications[0].import_pth: unknown key"),
        ("request_timeout_s:", "request_timeout:", "http_options.request_timeout: unknown key"),
        ("request_timeout_s: 600", "request_timeout_s: soon", "request_timeout_s: Input should"),
        ("dp_size: 8", "dp_sise: 8", "args.dp_sise: "),
        ("dp_size: 8", "dp_size: '8'", "--dp-size must be a positive integer, got '8'"),
        ("router: least-loaded", "router: fastest", "args.router: "),
        (
            "prefill_any_attempt_interval: 16",
            "prefill_any_attempt_interval: null",
            "--prefill-policy roundgate needs --prefill-any-attempt-interval",
        ),
        ("num_groups: 1", "num_groups: 1\n      route_weights: [1]", "route_weights"),
    ],
)
def test_broken_serve_config_is_reported(
    service: dict[str, Any], old: str, new: str, problem: str
) -> None:
    config = service["spec"]["serveConfigV2"]
    assert old in config
    problems = check_serve_config(config.replace(old, new, 1))
    assert any(problem in p for p in problems), problems


def test_broken_core_object_fails_kubernetes_validate() -> None:
    (job,) = render(REPO / "k8s" / "base" / "preflight")
    job["spec"]["template"]["spec"]["restartPolicyy"] = "Never"
    with pytest.raises(kubernetes_validate.ValidationError, match="restartPolicyy"):
        kubernetes_validate.validate(job, "1.33.0", strict=True)
    job["spec"]["template"]["spec"].pop("restartPolicyy")
    job["spec"]["backoffLimit"] = "0"
    with pytest.raises(kubernetes_validate.ValidationError, match="'0' is not of type"):
        kubernetes_validate.validate(job, "1.33.0", strict=True)


def test_broken_podmonitor_fails_the_bundled_schema() -> None:
    monitor = next(o for o in render(REPO / "k8s" / "base" / "serve") if o["kind"] == "PodMonitor")
    monitor["spec"]["podMetricEndpoints"] = monitor["spec"].pop("podMetricsEndpoints")
    with pytest.raises(jsonschema.ValidationError, match="podMetricEndpoints"):
        jsonschema.validate(monitor, PODMONITOR_SCHEMA)


@pytest.mark.parametrize(
    ("image", "rule", "expected"),
    [
        ("roundgate:latest", {"name": "roundgate", "newTag": "1.0"}, "roundgate:1.0"),
        ("roundgate", {"name": "roundgate", "newName": "r.io/x/roundgate"}, "r.io/x/roundgate"),
        ("roundgate:latest", {"name": "roundgate", "newName": "r.io/rg"}, "r.io/rg:latest"),
        ("roundgate:1", {"name": "roundgate", "digest": "sha256:ab"}, "roundgate@sha256:ab"),
        ("other:1", {"name": "roundgate", "newTag": "2"}, "other:1"),
        (
            "localhost:5000/roundgate:1",
            {"name": "localhost:5000/roundgate", "newTag": "2"},
            "localhost:5000/roundgate:2",
        ),
    ],
)
def test_images_rule(tmp_path: Path, image: str, rule: dict[str, str], expected: str) -> None:
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}}
    pod["spec"] = {"initContainers": [{"name": "i", "image": image}]}
    (tmp_path / "pod.yaml").write_text(yaml.safe_dump(pod))
    kustomization = {"resources": ["pod.yaml"], "images": [rule]}
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
    (out,) = render(tmp_path)
    assert out["spec"]["initContainers"][0]["image"] == expected


@pytest.mark.parametrize(
    ("op", "message"),
    [
        ({"op": "replace", "path": "/spec/nope", "value": 1}, "no such field"),
        ({"op": "add", "path": "/spec/a/b", "value": 1}, "no 'a' on the way"),
        ({"op": "test", "path": "/spec/list/0", "value": 9}, "test /spec/list/0: 1 != 9"),
        ({"op": "move", "from": "/spec/list", "path": "/spec/x"}, "unsupported op 'move'"),
        ({"op": "remove", "path": "/spec/list/5"}, "index out of range"),
    ],
)
def test_json6902_errors(op: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        apply_operation({"spec": {"list": [1, 2]}}, op)


def test_json6902_list_ops() -> None:
    obj: dict[str, Any] = {"spec": {"list": [1, 2], "a~b": {"c/d": 0}}}
    apply_operation(obj, {"op": "add", "path": "/spec/list/-", "value": 3})
    apply_operation(obj, {"op": "add", "path": "/spec/list/0", "value": 0})
    apply_operation(obj, {"op": "remove", "path": "/spec/list/1"})
    apply_operation(obj, {"op": "replace", "path": "/spec/a~0b/c~1d", "value": 1})
    assert obj == {"spec": {"list": [0, 2, 3], "a~b": {"c/d": 1}}}


def test_renderer_refuses_what_it_does_not_know(tmp_path: Path) -> None:
    (tmp_path / "kustomization.yaml").write_text("namePrefix: x-\nresources: []\n")
    with pytest.raises(ValueError, match=r"unsupported keys \['namePrefix'\]"):
        render(tmp_path)
    (tmp_path / "kustomization.yaml").write_text(
        "resources: []\npatches:\n  - target: {kind: Job}\n    patch: '[]'\n"
    )
    with pytest.raises(ValueError, match="matches no resource"):
        render(tmp_path)
