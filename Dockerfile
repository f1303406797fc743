# roundgate server image for KubeRay (head, GPU workers, bench RayJob, nccl preflight Job).
#
# Base: the rayproject/ray GPU image of the Ray version pinned in pyproject.toml, so the Ray
# inside matches `rayVersion` in k8s/ and the image already runs as the non-root `ray` user
# (uid 1000) KubeRay expects. The project and its GPU extras go on top with the repo's
# constraints; nccl-tests' all_gather_perf is built in a CUDA devel stage for the preflight Job.
#   docker build -t registry.example.com/roundgate:0.1.0 .
# Not built in CI (no docker engine there); tests/test_dockerfile.py checks that its ports,
# user, Ray version and commands agree with the manifests.
ARG BASE_IMAGE=rayproject/ray:2.60.0-py311-cu128
ARG CUDA_DEVEL_IMAGE=nvidia/cuda:12.8.1-devel-ubuntu22.04

FROM ${CUDA_DEVEL_IMAGE} AS nccl-tests
ARG NCCL_TESTS_VERSION=2.18.2
ADD https://github.com/NVIDIA/nccl-tests/archive/refs/tags/v${NCCL_TESTS_VERSION}.tar.gz /tmp/nccl-tests.tar.gz
RUN mkdir -p /src /opt/nccl-tests/lib \
    && tar -xzf /tmp/nccl-tests.tar.gz -C /src --strip-components=1 \
    && make -C /src -j"$(nproc)" MPI=0 CUDA_HOME=/usr/local/cuda \
    && cp -r /src/build /opt/nccl-tests/bin \
    && cp -P /usr/lib/x86_64-linux-gnu/libnccl.so.2* /opt/nccl-tests/lib/

FROM ${BASE_IMAGE}
USER root
COPY --from=nccl-tests /opt/nccl-tests /opt/nccl-tests
# A wrapper, not a global LD_LIBRARY_PATH: torch keeps loading the NCCL it ships with.
RUN printf '#!/bin/sh\nLD_LIBRARY_PATH=/opt/nccl-tests/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} exec /opt/nccl-tests/bin/all_gather_perf "$@"\n' \
        > /usr/local/bin/all_gather_perf \
    && chmod 0755 /usr/local/bin/all_gather_perf

WORKDIR /opt/roundgate
COPY --chown=1000:100 . /opt/roundgate
USER 1000
RUN pip install --no-cache-dir -c constraints.txt ".[gpu]"

# Serve HTTP and the app's /metrics, Ray dashboard, GCS, Ray client, Ray metrics.
EXPOSE 8000 8265 6379 10001 8080
HEALTHCHECK --interval=30s --timeout=5s --start-period=600s --retries=3 \
    CMD python -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/-/healthz', timeout=4)" || exit 1
# Outside KubeRay (which starts Ray itself): the local deployment.
CMD ["roundgate", "serve"]
