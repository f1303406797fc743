"""The manifests' security, checked offline on every rendered kustomization (docs/security.md).

- every pod (Ray head and workers, the RayJob's submitter, the preflight Job) is hardened:
  non-root, no privilege escalation, all capabilities dropped, ``RuntimeDefault`` seccomp, no
  service account token;
- every RayCluster, RayService and RayJob turns on Ray token auth (``authOptions``) from a
  Secret that ``k8s/base/secrets`` defines with the key KubeRay reads, and every
  ``secretKeyRef`` names a Secret and key defined there;
- the Secrets are templates (placeholders only) that no deploy stage ships;
- NetworkPolicies select every Ray pod; only port 8000 is open to any peer, everything else to
  the cluster's own pods (plus the dashboard to the KubeRay operator and Ray's metrics port to
  Prometheus);
- no manifest holds an API key (not in serveConfigV2, env values, args or the entrypoint).

Each check returns its problems, so the last tests can show it catches a broken copy.
"""

from __future__ import annotations

import copy
import re
import shlex
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml
from shared_data import DATA, shared_dir

from roundgate.k8s.tools.crd_schema import CrdValidator, load_crd
from roundgate.k8s.tools.render import render

REPO = Path(__file__).resolve().parents[1]
K8S = REPO / "k8s"
SECRETS = "base/secrets"
KUSTOMIZATIONS = sorted(
    p.parent.relative_to(K8S).as_posix() for p in K8S.rglob("kustomization.yaml")
)
DEPLOYED = [d for d in KUSTOMIZATIONS if d != SECRETS]
RAY_KINDS = {"RayCluster", "RayService", "RayJob"}
SERVE_PORT = 8000
RAY_TOKEN_KEY = "auth_token"  # KubeRay's RAY_AUTH_TOKEN_SECRET_KEY
PLACEHOLDER = "REPLACE-ME"
SECRET_ENV = {"ROUNDGATE_API_KEY", "RAY_AUTH_TOKEN"}  # never a literal `value`
# Who may reach a port of a Ray pod from outside its cluster, and which ports: pods labelled
# app.kubernetes.io/name=<key> (their Helm charts' labels), in any namespace.
SYSTEM_PEERS = {"kuberay-operator": {8265}, "prometheus": {8080}}


@cache
def rendered(directory: str) -> tuple[dict[str, Any], ...]:
    return tuple(render(K8S / directory))


@cache
def secret_keys() -> dict[str, set[str]]:
    """Secret name -> its keys, as ``k8s/base/secrets`` defines them."""
    return {
        obj["metadata"]["name"]: set(obj.get("stringData", {})) | set(obj.get("data", {}))
        for obj in rendered(SECRETS)
        if obj["kind"] == "Secret"
    }


def walk(node: Any) -> Iterator[Any]:
    yield node
    children = node.values() if isinstance(node, dict) else node if isinstance(node, list) else ()
    for child in children:
        yield from walk(child)


def pod_templates(obj: dict[str, Any]) -> list[dict[str, Any]]:
    """Every pod template (``metadata`` + ``spec`` with containers) anywhere in ``obj``."""
    return [
        node
        for node in walk(obj)
        if isinstance(node, dict)
        and isinstance(node.get("spec"), dict)
        and "containers" in node["spec"]
    ]


def cluster_spec(obj: dict[str, Any]) -> dict[str, Any]:
    spec = obj["spec"]
    return {"RayCluster": spec, "RayService": spec.get("rayClusterConfig", {})}.get(
        obj["kind"], spec.get("rayClusterSpec", {})
    )


def ray_pods(obj: dict[str, Any]) -> list[dict[str, Any]]:
    """The Ray head and worker pod templates of a Ray custom resource."""
    spec = cluster_spec(obj)
    groups = [spec["headGroupSpec"], *spec.get("workerGroupSpecs", [])]
    return [group["template"] for group in groups]


# ---- the checks ----------------------------------------------------------------------------


def pod_problems(template: dict[str, Any]) -> list[str]:
    spec = template["spec"]
    pod = spec.get("securityContext", {})
    problems = []
    if spec.get("automountServiceAccountToken") is not False:
        problems.append("automountServiceAccountToken is not false")
    if pod.get("runAsNonRoot") is not True or pod.get("runAsUser") == 0:
        problems.append("pod securityContext.runAsNonRoot is not true")
    if spec.get("hostNetwork") or spec.get("hostPID") or spec.get("hostIPC"):
        problems.append("the pod shares a host namespace")
    containers = spec["containers"] + spec.get("initContainers", [])
    for container in containers:
        name, context = container["name"], container.get("securityContext", {})
        seccomp = context.get("seccompProfile", pod.get("seccompProfile", {}))
        if seccomp.get("type") != "RuntimeDefault":
            problems.append(f"{name}: seccompProfile is not RuntimeDefault")
        if context.get("allowPrivilegeEscalation") is not False:
            problems.append(f"{name}: allowPrivilegeEscalation is not false")
        capabilities = context.get("capabilities", {})
        if "ALL" not in capabilities.get("drop", []) or capabilities.get("add"):
            problems.append(f"{name}: capabilities do not drop ALL (or add some back)")
        if context.get("privileged") or context.get("runAsNonRoot") is False:
            problems.append(f"{name}: privileged or root")
    return problems


def auth_problems(obj: dict[str, Any]) -> list[str]:
    auth = cluster_spec(obj).get("authOptions", {})
    if auth.get("mode") != "token":
        return ["authOptions.mode is not token"]
    if auth.get("enableK8sTokenAuth"):
        return ["enableK8sTokenAuth needs pods with a service account token"]
    name = auth.get("secretName")
    if RAY_TOKEN_KEY not in secret_keys().get(name, set()):
        return [f"authOptions.secretName {name!r} is no Secret in {SECRETS} with {RAY_TOKEN_KEY}"]
    return []


def secret_ref_problems(obj: dict[str, Any]) -> list[str]:
    problems = []
    for node in walk(obj):
        if isinstance(node, dict) and "secretKeyRef" in node:
            ref = node["secretKeyRef"]
            if ref.get("key") not in secret_keys().get(ref.get("name"), set()):
                problems.append(f"secretKeyRef {ref} is no Secret key in {SECRETS}")
            if ref.get("optional"):
                problems.append(f"secretKeyRef {ref} is optional: a missing Secret must fail")
    return problems


def literal_key_problems(obj: dict[str, Any]) -> list[str]:
    """An API key or Ray token written into the object rather than read from a Secret."""
    problems = []
    if obj["kind"] == "RayService":
        config = yaml.safe_load(obj["spec"]["serveConfigV2"])
        for app in config.get("applications", []):
            if (app.get("args") or {}).get("api_key"):
                problems.append(f"serveConfigV2: app {app['name']} sets api_key")
            env = ((app.get("runtime_env") or {}).get("env_vars")) or {}
            problems += [f"serveConfigV2 env_vars: {k}" for k in env if k in SECRET_ENV]
    for node in walk(obj):
        if isinstance(node, dict) and node.get("name") in SECRET_ENV and "value" in node:
            problems.append(f"env {node['name']} has a literal value")
    argv: list[str] = []
    if obj["kind"] == "RayJob":
        argv += shlex.split(obj["spec"]["entrypoint"])
        if argv[:2] == ["bash", "-c"]:  # the command line the head's bash runs
            argv = shlex.split(argv[2])
    for template in pod_templates(obj):
        for container in template["spec"]["containers"]:
            argv += [*container.get("command", []), *container.get("args", [])]
    for i, arg in enumerate(argv):
        given = arg.split("=", 1)[1] if arg.startswith("--api-key=") else None
        if arg == "--api-key":
            given = argv[i + 1] if i + 1 < len(argv) else ""
        if given is not None and not re.fullmatch(r"\$\{?ROUNDGATE_API_KEY\}?", given):
            problems.append(f"--api-key {given!r} is not read from $ROUNDGATE_API_KEY")
    return problems


def selects(policy: dict[str, Any], labels: dict[str, str]) -> bool:
    selector = policy["spec"]["podSelector"]
    wanted = selector.get("matchLabels", {})
    return (
        bool(wanted) and not selector.get("matchExpressions") and wanted.items() <= labels.items()
    )


def rule_ports(rule: dict[str, Any]) -> set[Any] | None:
    """The ports a rule opens (None: every port)."""
    ports = rule.get("ports")
    if not ports:
        return None
    if any(p.get("protocol", "TCP") != "TCP" or "endPort" in p for p in ports):
        return {"non-TCP or a range"}
    return {p.get("port") for p in ports}


def policy_problems(objects: tuple[dict[str, Any], ...], pods: list[dict[str, Any]]) -> list[str]:
    """Every pod selected by an ingress policy; each rule opens only what it may."""
    policies = [o for o in objects if o["kind"] == "NetworkPolicy"]
    problems = []
    for pod in pods:
        labels = pod["metadata"]["labels"]
        mine = [p for p in policies if selects(p, labels)]
        if not any("Ingress" in p["spec"].get("policyTypes", []) for p in mine):
            problems.append(f"no ingress NetworkPolicy selects pods labelled {labels}")
        for policy in mine:
            own = policy["spec"]["podSelector"]
            for rule in policy["spec"].get("ingress", []):
                ports = rule_ports(rule)
                peers = rule.get("from")
                if not peers:  # any peer: the OpenAI API only
                    if ports != {SERVE_PORT}:
                        problems.append(f"{policy['metadata']['name']}: {ports} open to all")
                    continue
                for peer in peers:
                    if set(peer) == {"podSelector"} and peer["podSelector"] == own:
                        continue  # the cluster's own pods: every port
                    component = peer.get("podSelector", {}).get("matchLabels", {})
                    allowed = SYSTEM_PEERS.get(component.get("app.kubernetes.io/name", ""))
                    if allowed is None or "ipBlock" in peer or ports is None or ports - allowed:
                        problems.append(f"{policy['metadata']['name']}: {peer} may reach {ports}")
    return problems


# ---- on the shipped manifests ---------------------------------------------------------------


def templates_of(directory: str) -> list[tuple[str, dict[str, Any]]]:
    return [
        (f"{obj['kind']}/{obj['metadata']['name']}", template)
        for obj in rendered(directory)
        for template in pod_templates(obj)
    ]


@pytest.mark.parametrize("directory", DEPLOYED)
def test_every_pod_is_hardened(directory: str) -> None:
    templates = templates_of(directory)
    problems = [f"{where}: {p}" for where, t in templates for p in pod_problems(t)]
    assert problems == []


def test_every_ray_job_has_a_hardened_submitter() -> None:
    """K8sJobMode's default submitter pod carries none of the hardening: ours is given."""
    jobs = [o for d in DEPLOYED for o in rendered(d) if o["kind"] == "RayJob"]
    assert jobs
    for job in jobs:
        if job["spec"].get("submissionMode", "K8sJobMode") == "K8sJobMode":
            assert pod_problems(job["spec"]["submitterPodTemplate"]) == []


@pytest.mark.parametrize("directory", DEPLOYED)
def test_ray_resources_use_token_auth_from_a_defined_secret(directory: str) -> None:
    problems = [
        f"{o['kind']}/{o['metadata']['name']}: {p}"
        for o in rendered(directory)
        if o["kind"] in RAY_KINDS
        for p in auth_problems(o)
    ]
    assert problems == []


@pytest.mark.parametrize("directory", DEPLOYED)
def test_every_secret_reference_resolves(directory: str) -> None:
    problems = [p for o in rendered(directory) for p in secret_ref_problems(o)]
    assert problems == []


@pytest.mark.parametrize("directory", DEPLOYED)
def test_ray_pods_read_the_api_key_from_its_secret(directory: str) -> None:
    """The ingress may run in any Ray pod: each gets $ROUNDGATE_API_KEY from the Secret."""
    for obj in rendered(directory):
        if obj["kind"] not in RAY_KINDS:
            continue
        for pod in ray_pods(obj):
            for container in pod["spec"]["containers"]:
                env = {e["name"]: e for e in container.get("env", [])}
                ref = env["ROUNDGATE_API_KEY"]["valueFrom"]["secretKeyRef"]
                assert ref == {"name": "roundgate-api-key", "key": "api_key"}


def test_secrets_are_placeholder_templates_no_stage_ships() -> None:
    assert set(secret_keys()) == {"roundgate-ray-auth", "roundgate-api-key"}
    for obj in rendered(SECRETS):
        assert obj["kind"] == "Secret" and "data" not in obj
        for value in obj["stringData"].values():
            assert value.startswith(PLACEHOLDER), "a template holds placeholders, never a key"
    for directory in DEPLOYED:  # a shipped placeholder would become the real key
        assert not [o for o in rendered(directory) if o["kind"] == "Secret"], directory


@pytest.mark.parametrize("directory", DEPLOYED)
def test_no_manifest_holds_a_key(directory: str) -> None:
    problems = [p for o in rendered(directory) for p in literal_key_problems(o)]
    assert problems == []
    text = "\n".join(yaml.safe_dump(o) for o in rendered(directory))
    assert PLACEHOLDER not in text


@pytest.mark.parametrize(
    "directory", [d for d in DEPLOYED if any(o["kind"] in RAY_KINDS for o in rendered(d))]
)
def test_network_policies_close_everything_but_the_api(directory: str) -> None:
    objects = rendered(directory)
    pods = [pod for o in objects if o["kind"] in RAY_KINDS for pod in ray_pods(o)]
    pods += [
        o["spec"]["submitterPodTemplate"]
        for o in objects
        if o["kind"] == "RayJob" and "submitterPodTemplate" in o["spec"]
    ]
    assert policy_problems(objects, pods) == []
    if any(o["kind"] == "RayService" for o in objects):  # clients reach the API
        rules = [r for o in objects if o["kind"] == "NetworkPolicy" for r in o["spec"]["ingress"]]
        assert any(not r.get("from") and rule_ports(r) == {SERVE_PORT} for r in rules)


# ---- the checks catch a broken copy (each change below is what the manifests had before) -----


@pytest.fixture()
def service() -> dict[str, Any]:
    (obj,) = [o for o in rendered("base/serve") if o["kind"] == "RayService"]
    return copy.deepcopy(obj)


def test_checks_catch_an_unhardened_pod(service: dict[str, Any]) -> None:
    head = ray_pods(service)[0]
    head["spec"]["securityContext"] = {"runAsNonRoot": True}
    del head["spec"]["automountServiceAccountToken"]
    head["spec"]["containers"][0]["securityContext"]["capabilities"]["add"] = ["NET_ADMIN"]
    assert pod_problems(head) == [
        "automountServiceAccountToken is not false",
        "ray-head: seccompProfile is not RuntimeDefault",
        "ray-head: capabilities do not drop ALL (or add some back)",
    ]


def test_checks_catch_missing_auth_and_a_literal_key(service: dict[str, Any]) -> None:
    del service["spec"]["rayClusterConfig"]["authOptions"]
    assert auth_problems(service) == ["authOptions.mode is not token"]
    service["spec"]["rayClusterConfig"]["authOptions"] = {"mode": "token", "secretName": "other"}
    assert "is no Secret" in auth_problems(service)[0]
    service["spec"]["serveConfigV2"] = re.sub(
        r"args:\n( +)", r"args:\n\1api_key: sk-123\n\1", service["spec"]["serveConfigV2"]
    )
    env = ray_pods(service)[1]["spec"]["containers"][0]["env"]
    env[0] = {"name": "ROUNDGATE_API_KEY", "value": "sk-123"}
    assert literal_key_problems(service) == [
        "serveConfigV2: app roundgate sets api_key",
        "env ROUNDGATE_API_KEY has a literal value",
    ]


def test_checks_catch_an_open_port() -> None:
    objects = copy.deepcopy(rendered("base/serve"))
    (service,) = [o for o in objects if o["kind"] == "RayService"]
    assert policy_problems((), ray_pods(service))  # no policy at all
    (policy,) = [o for o in objects if o["kind"] == "NetworkPolicy"]
    policy["spec"]["ingress"].append({"ports": [{"port": 8265}]})  # the dashboard to anyone
    policy["spec"]["ingress"].append(
        {"from": [{"ipBlock": {"cidr": "0.0.0.0/0"}}], "ports": [{"port": 6379}]}
    )
    policy["spec"]["ingress"].append(
        {"from": [{"namespaceSelector": {}, "podSelector": {}}]}  # every pod, every port
    )
    assert len(set(policy_problems(tuple(objects), ray_pods(service)))) == 3


SHARED_CRDS = shared_dir("kuberay-crds")


@pytest.mark.parametrize(
    "crds",
    [
        pytest.param(DATA / "kuberay-crds", id="repo-subset"),
        pytest.param(
            SHARED_CRDS,
            id="shared-full",
            marks=pytest.mark.skipif(SHARED_CRDS is None, reason="../shared/kuberay-crds absent"),
        ),
    ],
)
def test_the_crds_refuse_a_bad_auth_option(crds: Path, service: dict[str, Any]) -> None:
    validator = CrdValidator(load_crd(crds / "ray.io_rayservices.yaml"))
    assert validator.errors(service) == []
    auth = service["spec"]["rayClusterConfig"]["authOptions"]
    auth["mode"] = "tokens"
    auth["secretname"] = auth.pop("secretName")
    path = "spec.rayClusterConfig.authOptions"
    assert validator.errors(service) == [
        f"{path}.mode: 'tokens' is not one of ['disabled', 'token']",
        f"{path}.secretname: unknown field",
    ]
