"""The manifests agree with each other and with the code: GPUs vs dp_size, ports, images, the
preflight command, the bench URL, the experiment cluster, and the generated dashboards."""

from __future__ import annotations

import shlex
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

from roundgate.k8s.tools import dashboards_configmap
from roundgate.k8s.tools.nccl_tests import all_gather_command
from roundgate.k8s.tools.nccl_tests.__main__ import main as nccl_main
from roundgate.k8s.tools.render import load_documents, render

REPO = Path(__file__).resolve().parents[1]
K8S = REPO / "k8s"
SERVE_PORT = 8000
PROFILES = ["base", *sorted(f"overlays/{p.name}" for p in (K8S / "overlays").iterdir())]
STAGES = ("serve", "preflight", "bench", "experiment")


@cache
def stage(profile: str, name: str) -> tuple[dict[str, Any], ...]:
    directory = K8S / profile / name
    return tuple(render(directory)) if directory.is_dir() else ()


def one(profile: str, name: str, kind: str) -> dict[str, Any]:
    (obj,) = [o for o in stage(profile, name) if o["kind"] == kind]
    return obj


def with_stage(name: str) -> list[str]:
    return [p for p in PROFILES if stage(p, name)]


def app_args(service: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    config = yaml.safe_load(service["spec"]["serveConfigV2"])
    (app,) = config["applications"]
    return config, app["args"]


def worker(cluster_spec: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    (group,) = cluster_spec["workerGroupSpecs"]
    return group, group["template"]["spec"]["containers"][0]


def gpus(container: dict[str, Any]) -> int:
    return int(container["resources"].get("limits", {}).get("nvidia.com/gpu", 0))


def images(objects: Any) -> set[str]:
    found: set[str] = set()
    if isinstance(objects, dict):
        found |= {objects["image"]} if "image" in objects else set()
        for value in objects.values():
            found |= images(value)
    elif isinstance(objects, list | tuple):
        for item in objects:
            found |= images(item)
    return found


def serve_profiles(pd: bool) -> list[str]:
    """Serve profiles of one kind: P/D (a prefill and a decode section) or fused."""
    return [
        p
        for p in with_stage("serve")
        if ("prefill" in app_args(one(p, "serve", "RayService"))[1]) == pd
    ]


@pytest.mark.parametrize("profile", serve_profiles(pd=True))
def test_pd_roles_fill_whole_worker_pods(profile: str) -> None:
    """Each role's ranks fill whole GPU pods (its collectives stay on its own nodes), and the
    pods hold both roles exactly."""
    service = one(profile, "serve", "RayService")
    _, args = app_args(service)
    group, container = worker(service["spec"]["rayClusterConfig"])
    per_pod, per_rank = gpus(container), args.get("num_gpus_per_rank", 0)
    assert args["device"] == "cuda" and per_pod > 0 and per_rank > 0
    role_gpus = [args[role]["dp_size"] * per_rank for role in ("prefill", "decode")]
    assert all(g % per_pod == 0 for g in role_gpus), (role_gpus, per_pod)
    assert group["replicas"] == group["minReplicas"] == group["maxReplicas"]
    assert group["replicas"] * per_pod == sum(role_gpus)


@pytest.mark.parametrize("profile", serve_profiles(pd=False))
def test_worker_pods_hold_one_dp_group(profile: str) -> None:
    """A pod holds one whole group (``pack``), or one rank of each group (``spread``: a pod's
    loss costs each group one rank); a front door pinned to the head fits there."""
    service = one(profile, "serve", "RayService")
    _, args = app_args(service)
    cluster = service["spec"]["rayClusterConfig"]
    group, container = worker(cluster)
    per_rank = args.get("num_gpus_per_rank", 0)
    spread = args.get("gang_placement", "pack") == "spread"
    ranks_per_pod = args["num_groups"] if spread else args["dp_size"]
    expected = ranks_per_pod * per_rank if args["device"] == "cuda" else 0
    assert expected == int(expected) and (args["device"] != "cuda" or expected > 0)
    assert gpus(container) == expected
    requests = container["resources"].get("requests", {})
    assert int(requests.get("nvidia.com/gpu", expected)) == expected
    pods = args["dp_size"] if spread else args["num_groups"]
    assert group["replicas"] == group["minReplicas"] == group["maxReplicas"] == pods
    if spread and args["device"] != "cuda":  # each pod has CPUs for its ranks
        cpus = ranks_per_pod * args.get("num_cpus_per_rank", 1)
        assert int(group["rayStartParams"]["num-cpus"]) >= cpus
    head = cluster["headGroupSpec"]
    if "node:__internal_head__" in args.get("ingress_resources", {}):
        ingress_cpus = 0.25 * args.get("ingress_replicas", 1)  # deployment/app.py's ingress
        assert float(head["rayStartParams"]["num-cpus"]) >= ingress_cpus
    assert gpus(head["template"]["spec"]["containers"][0]) == 0
    assert head["rayStartParams"]["num-gpus"] == "0"


@pytest.mark.parametrize("profile", with_stage("serve"))
def test_serve_port_and_metrics_endpoints_agree(profile: str) -> None:
    service = one(profile, "serve", "RayService")
    config, args = app_args(service)
    assert config["http_options"]["port"] == args.get("port", SERVE_PORT) == SERVE_PORT
    cluster = service["spec"]["rayClusterConfig"]
    pods = [cluster["headGroupSpec"]["template"]] + [
        g["template"] for g in cluster["workerGroupSpecs"]
    ]
    monitor = one(profile, "serve", "PodMonitor")
    selector = monitor["spec"]["selector"]["matchLabels"]
    for pod in pods:
        assert selector.items() <= pod["metadata"]["labels"].items()
        ports = {p["name"]: p["containerPort"] for p in pod["spec"]["containers"][0]["ports"]}
        assert ports["serve"] == SERVE_PORT
        for endpoint in monitor["spec"]["podMetricsEndpoints"]:
            assert endpoint["port"] in ports
    assert {"port": "serve", "path": "/metrics"}.items() <= monitor["spec"]["podMetricsEndpoints"][
        0
    ].items()
    _, container = worker(cluster)
    assert container["readinessProbe"]["httpGet"]["port"] == "serve"
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in worker(cluster)[0]["template"]["spec"]["volumes"]}
    assert volumes[mounts["/dev/shm"]]["emptyDir"]["medium"] == "Memory"


@pytest.mark.parametrize("profile", PROFILES)
def test_one_image_per_profile(profile: str) -> None:
    found = set().union(*(images(stage(profile, s)) for s in STAGES))
    assert len(found) == 1, found


@pytest.mark.parametrize("profile", with_stage("preflight"))
def test_preflight_runs_our_command_and_parser(profile: str, tmp_path: Path) -> None:
    job = one(profile, "preflight", "Job")
    container = job["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e["value"] for e in container["env"]}
    num_gpus = int(env["NUM_GPUS"])
    assert gpus(container) == num_gpus
    if stage(profile, "serve"):
        assert num_gpus == app_args(one(profile, "serve", "RayService"))[1]["dp_size"]
    script = container["args"][0].replace("\\\n", " ")
    for name, value in env.items():
        script = script.replace(f'"${name}"', value)
    assert script.startswith("set -euo pipefail\n")
    stages = [shlex.split(part) for part in script.split("\n", 1)[1].split("|")]
    assert stages[0] == all_gather_command(num_gpus)
    assert stages[1] == ["tee", "/dev/stderr"]
    assert stages[2][:4] == ["python", "-m", "roundgate.k8s.tools.nccl_tests", "-"]
    # The parser stage's flags are the CLI's: run them on a tiny healthy table.
    table = tmp_path / "run.txt"
    table.write_text(
        "#  size count type redop root time algbw busbw #wrong time algbw busbw #wrong\n"
        + "".join(
            f"#  Rank {r} Group 0 Pid 1 on node device {r} [0000:0{r}:00] GPU\n"
            for r in range(num_gpus)
        )
        + f"1024 32 float none -1 10.0 0.1 0.1 0 10.0 0.1 0.1 0\n"
        f"1073741824 33554432 float none -1 1 1 {1e4} 0 1 1 {1e4} 0\n"
        "# Out of bounds values : 0 OK\n# Avg bus bandwidth : 1 \n"
    )
    assert nccl_main([str(table), *stages[2][4:]]) == 0


@pytest.mark.parametrize("profile", with_stage("bench"))
def test_bench_job_targets_the_service_and_keeps_its_report(profile: str) -> None:
    job = one(profile, "bench", "RayJob")
    argv = shlex.split(job["spec"]["entrypoint"])
    assert argv[:2] == ["bash", "-c"] and len(argv) == 3  # the key expands on the head
    argv = shlex.split(argv[2])
    assert argv[:3] == ["exec", "roundgate", "bench"]
    assert argv[argv.index("--api-key") + 1] == "$ROUNDGATE_API_KEY"
    url, report = argv[argv.index("--url") + 1], argv[argv.index("--json") + 1]
    service = one("base", "serve", "RayService")["metadata"]["name"]
    assert url == f"http://{service}-serve-svc:{SERVE_PORT}"
    pod = job["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]
    mounts = {m["mountPath"]: m["name"] for m in pod["containers"][0]["volumeMounts"]}
    volume = {v["name"]: v for v in pod["volumes"]}[mounts[str(Path(report).parent)]]
    claims = {
        o["metadata"]["name"]
        for o in stage(profile, "bench")
        if o["kind"] == "PersistentVolumeClaim"
    }
    assert volume["persistentVolumeClaim"]["claimName"] in claims
    assert job["spec"]["shutdownAfterJobFinishes"] is True


def test_experiment_cluster_matches_the_service_cluster() -> None:
    service = one("base", "serve", "RayService")["spec"]["rayClusterConfig"]
    cluster = one("base", "experiment", "RayCluster")["spec"]
    assert cluster["rayVersion"] == service["rayVersion"]
    assert cluster["authOptions"] == service["authOptions"]
    pairs = [
        (service["headGroupSpec"], cluster["headGroupSpec"]),
        *list(zip(service["workerGroupSpecs"], cluster["workerGroupSpecs"], strict=True)),
    ]
    for ours, theirs in pairs:
        assert ours["rayStartParams"] == theirs["rayStartParams"]
        a, b = ours["template"]["spec"], theirs["template"]["spec"]
        assert a["volumes"] == b["volumes"]
        assert a.get("tolerations") == b.get("tolerations")
        for key in ("securityContext", "automountServiceAccountToken"):  # docs/security.md
            assert a.get(key) == b.get(key), key
        for key in ("image", "resources", "volumeMounts", "ports", "env", "securityContext"):
            assert a["containers"][0][key] == b["containers"][0][key], key


def test_dashboards_configmap_equals_dashboards_folder() -> None:
    (configmap,) = load_documents(dashboards_configmap.OUTPUT)
    files = {p.name: p.read_text(encoding="utf-8") for p in (REPO / "dashboards").glob("*.json")}
    assert (configmap.get("data") or {}) == files
    assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert dashboards_configmap.OUTPUT.read_text(encoding="utf-8") == dashboards_configmap.render()


def test_dashboards_generator(tmp_path: Path) -> None:
    assert dashboards_configmap.build_configmap(tmp_path)["data"] == {}
    (tmp_path / "b.json").write_text('{"title": "B"}\n')
    (tmp_path / "a.json").write_text('{"title": "A"}\n')
    (tmp_path / "notes.txt").write_text("ignored")
    assert list(dashboards_configmap.build_configmap(tmp_path)["data"]) == ["a.json", "b.json"]
    (tmp_path / "c.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match="must be a JSON object"):
        dashboards_configmap.build_configmap(tmp_path)
