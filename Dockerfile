# roundgate server image for KubeRay (head, GPU workers, bench RayJob, nccl preflight Job).
#
# Base: the rayproject/ray GPU image of the Ray version pinned in pyproject.toml, so the Ray
# inside matches `rayVersion` in k8s/ and the image already runs as the non-root `ray` user
# (uid 1000) KubeRay expects. The project and its GPU extras go on top with the repo's
# constraints; nccl-tests' all_gather_perf is built in a CUDA devel stage for the preflight Job.
#   docker build -t registry.example.com/roundgate:0.1.0 .
# Not built in CI (no docker engine there); tests/test_dockerfile.py checks that its ports,
# user, Ray version and commands agree with the manifests.
#
# The fused GPU path's kernels come prebuilt, so no request waits for a compiler: FlashInfer
# with its cubins and JIT cache, and DeepEP built here. Versions live in constraints.txt (one
# place; tests/test_dockerfile.py checks the two agree), except DeepEP's commit below.
ARG BASE_IMAGE=rayproject/ray:2.60.0-py311-cu128
ARG CUDA_DEVEL_IMAGE=nvidia/cuda:12.8.1-devel-ubuntu22.04
# The CUDA build of every CUDA wheel, the base image's 12.8: torch from PyTorch's index (the
# PyPI torch is a CUDA 13 build), FlashInfer's JIT cache from FlashInfer's.
ARG CUDA_WHEELS=cu128
ARG CUDA_HOME=/usr/local/cuda-12.8
ARG TORCH_INDEX=https://download.pytorch.org/whl
ARG FLASHINFER_INDEX=https://flashinfer.ai/whl
# DeepEP has no usable wheel (PyPI's deep-ep is a source build needing CUDA and NVSHMEM): its
# v1.2.1 release commit, built below as its README and install.sh do, against the NVSHMEM
# wheel torch brings (nvidia-nvshmem-cu12, >= the 3.3.9 DeepEP needs), for sm_90 (H100/H200).
ARG DEEPEP_COMMIT=9af0e0d0e74f3577af1979c9b9e1ac2cad0104ee

FROM ${CUDA_DEVEL_IMAGE} AS nccl-tests
ARG NCCL_TESTS_VERSION=2.18.2
ADD https://github.com/NVIDIA/nccl-tests/archive/refs/tags/v${NCCL_TESTS_VERSION}.tar.gz /tmp/nccl-tests.tar.gz
RUN mkdir -p /src /opt/nccl-tests/lib \
    && tar -xzf /tmp/nccl-tests.tar.gz -C /src --strip-components=1 \
    && make -C /src -j"$(nproc)" MPI=0 CUDA_HOME=/usr/local/cuda \
    && cp -r /src/build /opt/nccl-tests/bin \
    && cp -P /usr/lib/x86_64-linux-gnu/libnccl.so.2* /opt/nccl-tests/lib/

# DeepEP's wheel, built on the final image's base (same Python, same torch: the extension is
# tied to both) with the devel image's CUDA toolkit.
FROM ${BASE_IMAGE} AS deepep
ARG CUDA_WHEELS
ARG CUDA_HOME
ARG TORCH_INDEX
ARG DEEPEP_COMMIT
USER root
RUN apt-get update && apt-get install -y --no-install-recommends build-essential \
    && rm -rf /var/lib/apt/lists/*
COPY --from=nccl-tests ${CUDA_HOME} ${CUDA_HOME}
ADD --chown=1000:100 https://github.com/deepseek-ai/DeepEP/archive/${DEEPEP_COMMIT}.tar.gz /tmp/deepep.tar.gz
COPY --chown=1000:100 constraints.txt /tmp/constraints.txt
USER 1000
WORKDIR /tmp
RUN mkdir -p /tmp/deepep /tmp/wheels \
    && tar -xzf /tmp/deepep.tar.gz -C /tmp/deepep --strip-components=1 \
    && torch="$(sed -n 's/^torch==//p' /tmp/constraints.txt)" \
    && pip install --no-cache-dir -c /tmp/constraints.txt --extra-index-url ${TORCH_INDEX}/${CUDA_WHEELS} \
        "torch==${torch}+${CUDA_WHEELS}" nvidia-nvshmem-cu12 ninja setuptools wheel \
    && cd /tmp/deepep \
    && CUDA_HOME=${CUDA_HOME} PATH=${CUDA_HOME}/bin:$PATH TORCH_CUDA_ARCH_LIST=9.0 \
        python setup.py bdist_wheel \
    && cp dist/deep_ep-*.whl /tmp/wheels/

FROM ${BASE_IMAGE}
ARG CUDA_WHEELS
ARG TORCH_INDEX
ARG FLASHINFER_INDEX
USER root
COPY --from=nccl-tests /opt/nccl-tests /opt/nccl-tests
# A wrapper, not a global LD_LIBRARY_PATH: torch keeps loading the NCCL it ships with.
RUN printf '#!/bin/sh\nLD_LIBRARY_PATH=/opt/nccl-tests/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} exec /opt/nccl-tests/bin/all_gather_perf "$@"\n' \
        > /usr/local/bin/all_gather_perf \
    && chmod 0755 /usr/local/bin/all_gather_perf

WORKDIR /opt/roundgate
COPY --chown=1000:100 . /opt/roundgate
USER 1000
COPY --from=deepep /tmp/wheels /tmp/wheels
# torch as the CUDA 12.8 build of the pinned version, with the NVSHMEM wheel DeepEP's library
# was linked against (its rpath names that wheel's lib/); the gpu extra (flashinfer-python,
# flashinfer-cubin) and DeepEP's wheel at their pins; FlashInfer's JIT cache (its compiled
# attention kernels) from FlashInfer's index only, at flashinfer-python's version.
RUN torch="$(sed -n 's/^torch==//p' constraints.txt)" \
    && pip install --no-cache-dir -c constraints.txt --extra-index-url ${TORCH_INDEX}/${CUDA_WHEELS} \
        "torch==${torch}+${CUDA_WHEELS}" nvidia-nvshmem-cu12 ".[gpu]" /tmp/wheels/deep_ep-*.whl \
    && pip install --no-cache-dir --no-deps -c constraints.txt \
        --index-url ${FLASHINFER_INDEX}/${CUDA_WHEELS} flashinfer-jit-cache

# Serve HTTP and the app's /metrics, Ray dashboard, GCS, Ray client, Ray metrics.
EXPOSE 8000 8265 6379 10001 8080
HEALTHCHECK --interval=30s --timeout=5s --start-period=600s --retries=3 \
    CMD python -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/-/healthz', timeout=4)" || exit 1
# Outside KubeRay (which starts Ray itself): the local deployment.
CMD ["roundgate", "serve"]
