"""The Dockerfile (not buildable here) agrees with pyproject.toml and the k8s manifests."""

from __future__ import annotations

import re
import shlex
import tomllib
from pathlib import Path
from typing import Any

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from roundgate.k8s.tools.render import render

REPO = Path(__file__).resolve().parents[1]
K8S = REPO / "k8s"


def instructions() -> list[tuple[str, str]]:
    """``(INSTRUCTION, arguments)`` pairs with comments dropped and continuations joined."""
    text = re.sub(r"\\\n", " ", (REPO / "Dockerfile").read_text(encoding="utf-8"))
    pairs = []
    for line in text.splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            keyword, _, rest = line.strip().partition(" ")
            pairs.append((keyword.upper(), rest.strip()))
    return pairs


def final_stage() -> list[tuple[str, str]]:
    steps = instructions()
    last_from = max(i for i, (keyword, _) in enumerate(steps) if keyword == "FROM")
    return steps[last_from:]


def stage(name: str) -> list[tuple[str, str]]:
    """The instructions of the stage ``FROM ... AS name``, up to the next ``FROM``."""
    steps = instructions()
    (start,) = [
        i for i, (k, rest) in enumerate(steps) if k == "FROM" and rest.endswith(f" AS {name}")
    ]
    end = next((i for i in range(start + 1, len(steps)) if steps[i][0] == "FROM"), len(steps))
    return steps[start:end]


def build_args() -> dict[str, str]:
    """The ``ARG name=default`` values (the global ones come before the first ``FROM``)."""
    return dict(
        rest.split("=", 1) for keyword, rest in instructions() if keyword == "ARG" and "=" in rest
    )


def constraints() -> dict[str, str]:
    """constraints.txt's pins, by PEP 503 name: each line is ``name==version``."""
    pins = {}
    for line in (REPO / "constraints.txt").read_text(encoding="utf-8").splitlines():
        if line.strip() and not line.startswith("#"):
            requirement = Requirement(line)
            (spec,) = requirement.specifier
            assert spec.operator == "==", line
            pins[canonicalize_name(requirement.name)] = spec.version
    return pins


def pyproject() -> dict[str, Any]:
    return tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))


def all_objects() -> list[dict[str, Any]]:
    return [o for p in K8S.rglob("kustomization.yaml") for o in render(p.parent)]


def walk(node: Any, key: str) -> list[Any]:
    found = []
    if isinstance(node, dict):
        found += [node[key]] if key in node else []
        for value in node.values():
            found += walk(value, key)
    elif isinstance(node, list):
        for item in node:
            found += walk(item, key)
    return found


def test_base_image_matches_the_pinned_ray_version() -> None:
    (ray_pin,) = [d for d in pyproject()["project"]["dependencies"] if d.startswith("ray[")]
    version = ray_pin.split("==")[1]
    args = build_args()
    assert args["BASE_IMAGE"].startswith(f"rayproject/ray:{version}-")
    assert set(walk(all_objects(), "rayVersion")) == {version}


def test_runs_as_a_numeric_non_root_user() -> None:
    # Pods set runAsNonRoot: the kubelet can only verify a numeric USER.
    users = [rest for keyword, rest in final_stage() if keyword == "USER"]
    assert users and users[-1].split(":")[0].isdigit() and int(users[-1].split(":")[0]) > 0
    assert all(c["runAsNonRoot"] for c in walk(all_objects(), "securityContext"))


def test_exposes_every_container_port_of_the_manifests() -> None:
    exposed = {int(p) for k, rest in final_stage() if k == "EXPOSE" for p in rest.split()}
    declared = set(walk(all_objects(), "containerPort"))
    assert declared <= exposed


def test_healthcheck_probes_what_the_readiness_probe_probes() -> None:
    (check,) = [rest for keyword, rest in final_stage() if keyword == "HEALTHCHECK"]
    service = next(o for o in render(K8S / "base" / "serve") if o["kind"] == "RayService")
    worker = service["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]["template"]["spec"]
    probe = worker["containers"][0]["readinessProbe"]["httpGet"]
    ports = {p["name"]: p["containerPort"] for p in worker["containers"][0]["ports"]}
    assert f"127.0.0.1:{ports[probe['port']]}{probe['path']}" in check


def test_commands_used_by_the_manifests_exist_in_the_image() -> None:
    scripts = pyproject()["project"]["scripts"]
    setup = (REPO / "setup.py").read_text(encoding="utf-8")
    text = " ".join(rest for _, rest in final_stage())
    (cmd,) = [rest for keyword, rest in final_stage() if keyword == "CMD"]
    assert cmd.strip('[]"').split('"')[0] in scripts
    (bench,) = [o for o in render(K8S / "base" / "bench") if o["kind"] == "RayJob"]
    shell, flag, line = shlex.split(bench["spec"]["entrypoint"])  # bash -c 'exec roundgate ...'
    assert (shell, flag) == ("bash", "-c") and shlex.split(line)[0] == "exec"
    assert shlex.split(line)[1] in scripts
    # python -m roundgate.k8s.tools.nccl_tests in the preflight Job
    assert re.search(r'^    "k8s",$', setup, re.M)
    assert "/usr/local/bin/all_gather_perf" in text
    assert re.search(r"pip install [^&]*-c constraints\.txt", text)


@pytest.mark.parametrize("pattern", [".venv/", ".git/"])
def test_dockerignore_keeps_the_context_small(pattern: str) -> None:
    assert pattern in (REPO / ".dockerignore").read_text(encoding="utf-8").splitlines()


# --- the GPU kernels' pins -------------------------------------------------------------------


def test_the_gpu_extra_is_pinned_in_constraints_only() -> None:
    """One place for the versions: the extra names the distributions, constraints.txt pins
    them, and FlashInfer's packages (one release) share flashinfer-python's version."""
    pins = constraints()
    gpu = [Requirement(spec) for spec in pyproject()["project"]["optional-dependencies"]["gpu"]]
    names = {canonicalize_name(r.name) for r in gpu}
    assert {"flashinfer-python", "flashinfer-cubin"} <= names
    assert all(not r.specifier for r in gpu)
    assert names <= set(pins)
    flashinfer = pins["flashinfer-python"]
    assert pins["flashinfer-cubin"] == pins["flashinfer-jit-cache"] == flashinfer


def test_the_image_installs_the_pinned_gpu_kernels() -> None:
    installs = [
        rest
        for keyword, rest in final_stage()
        if keyword == "RUN"
        for rest in re.findall(r"pip install ([^&]*)", rest)
    ]
    assert installs and all("-c constraints.txt" in words for words in installs)
    (main,) = [words for words in installs if '".[gpu]"' in words]
    assert "/tmp/wheels/deep_ep-*.whl" in main  # the wheel the deepep stage built
    assert '"torch==${torch}+${CUDA_WHEELS}" nvidia-nvshmem-cu12' in main  # as DeepEP's build
    (jit,) = [words for words in installs if "flashinfer-jit-cache" in words]
    assert "--no-deps" in jit and "--index-url ${FLASHINFER_INDEX}/${CUDA_WHEELS}" in jit
    copied = [rest for keyword, rest in final_stage() if keyword == "COPY"]
    assert "--from=deepep /tmp/wheels /tmp/wheels" in copied


def test_deepep_is_built_from_a_pinned_commit_against_the_final_base() -> None:
    args = build_args()
    assert re.fullmatch(r"[0-9a-f]{40}", args["DEEPEP_COMMIT"])
    steps = stage("deepep")
    assert steps[0] == ("FROM", "${BASE_IMAGE} AS deepep")  # same Python and torch as served
    (fetch,) = [rest for keyword, rest in steps if keyword == "ADD"]
    assert "github.com/deepseek-ai/DeepEP/archive/${DEEPEP_COMMIT}.tar.gz" in fetch
    build = " ".join(rest for keyword, rest in steps if keyword == "RUN")
    assert '"torch==${torch}+${CUDA_WHEELS}"' in build and "nvidia-nvshmem-cu12" in build
    assert "TORCH_CUDA_ARCH_LIST=9.0" in build and "setup.py bdist_wheel" in build
    assert "deep-ep" in constraints()  # the built wheel's version, checked at install


def test_every_cuda_wheel_matches_the_images_cuda() -> None:
    args = build_args()
    flavour = args["CUDA_WHEELS"]
    major, minor = re.search(r"cuda:(\d+)\.(\d+)\.", args["CUDA_DEVEL_IMAGE"]).groups()
    assert flavour == f"cu{major}{minor}"
    assert args["BASE_IMAGE"].endswith(f"-{flavour}")
    assert args["CUDA_HOME"] == f"/usr/local/cuda-{major}.{minor}"
