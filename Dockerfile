# syntax=docker/dockerfile:1
# Three images from one file:
#   docker build --target operator -t ghcr.io/pdd-dev/pdd-operator:0.1.0 .
#   docker build --target sidecar  -t ghcr.io/pdd-dev/pdd-sidecar:0.1.0 .
#   docker build --target router   -t ghcr.io/pdd-dev/pdd-router:0.1.0 .
# `operator` runs `pdd-operator run` (the chart's Deployment); `sidecar` runs `pdd-sidecar`
# (NIXL sidecar and probe in engine pods) and, as its command, `pdd-node` (`preflight` init
# container in engine pods; `agent` in the topology DaemonSet). The entrypoints are the
# console scripts the tests run. `router` holds the upstream PD routers, the default of
# spec.router.image: the operator runs `vllm-router` for vLLM and `smg launch` for SGLang.

# Pinned by digest: a tag moves, a digest does not (bump both together).
ARG PYTHON_IMAGE=python:3.11-slim-bookworm@sha256:2e32f7d302adc1c37428355c1e646897c0c53f4fd60b6a551245fb90ee129f91

# ---------------------------------------------------------------------------- build
# Builds the project wheel and installs it with its pinned dependencies into /opt/venv; the
# runtime stages copy only that venv (no compilers, no pip cache, no sources).
FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
RUN python -m venv /opt/venv
COPY hack/constraints.txt hack/constraints.txt
COPY pyproject.toml README.md ./
COPY operator/ operator/
# The venv's own pip (ensurepip) builds the wheel: a base image needs python3 and its venv
# module, not a system pip.
RUN /opt/venv/bin/pip wheel --no-deps --wheel-dir /wheels . \
    && /opt/venv/bin/pip install -c hack/constraints.txt /wheels/*.whl

# The sidecar adds the NIXL wheel. It declares torch (gigabytes of CUDA wheels), which the
# sidecar never imports: NIXL moves buffers given as (address, length, device) and numpy
# provides host buffers. So: no deps, plus numpy. UCX, libibverbs and libmlx5 come bundled in
# the wheel; libcuda and libnvidia-ml come from the NVIDIA container toolkit at run time.
FROM build AS build-sidecar
RUN /opt/venv/bin/pip install -c hack/constraints.txt numpy \
    && /opt/venv/bin/pip install --no-deps -c hack/constraints.txt nixl-cu12==1.5.1 nixl==1.5.1

# The routers: PyPI wheels of the upstream Rust routers (a Python entry point loading an abi3
# extension), at the versions whose --help is in tests/fixtures/routers/. Nothing of the
# project goes in. `smg` is the SGLang router's current name; `sglang-router` would install a
# second `smg` script over it, so it is left out.
FROM ${PYTHON_IMAGE} AS build-router
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
COPY hack/constraints.txt /tmp/constraints.txt
RUN python -m venv /opt/venv \
    && /opt/venv/bin/pip install -c /tmp/constraints.txt vllm-router==0.1.17 smg==1.13.0

# ---------------------------------------------------------------------------- runtime base
FROM ${PYTHON_IMAGE} AS runtime
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
# A fixed non-root UID/GID (the distroless `nonroot` id) that matches the chart's
# runAsUser, so `runAsNonRoot` can be verified by the kubelet from the image metadata.
RUN groupadd --system --gid 65532 pdd \
    && useradd --system --uid 65532 --gid 65532 --no-create-home --home-dir /nonexistent \
       --shell /usr/sbin/nologin pdd
WORKDIR /tmp
LABEL org.opencontainers.image.source="https://github.com/pdd-dev/pdd-operator" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="0.1.0"

# ---------------------------------------------------------------------------- operator
FROM runtime AS operator
COPY --from=build /opt/venv /opt/venv
LABEL org.opencontainers.image.title="pdd-operator" \
      org.opencontainers.image.description="Operator for prefill/decode-disaggregated LLM inference"
USER 65532:65532
# 8080: kopf liveness (/healthz); 8081: Prometheus metrics.
EXPOSE 8080 8081
ENTRYPOINT ["pdd-operator"]
CMD ["run"]

# ---------------------------------------------------------------------------- sidecar
FROM runtime AS sidecar
COPY --from=build-sidecar /opt/venv /opt/venv
LABEL org.opencontainers.image.title="pdd-sidecar" \
      org.opencontainers.image.description="pdd preflight, NIXL sidecar, transfer probe and node topology agent"
USER 65532:65532
# No EXPOSE: the operator renders the sidecar's port (PDD_SIDECAR_PORT) into each pod.
ENTRYPOINT ["pdd-sidecar"]
CMD ["serve"]

# ---------------------------------------------------------------------------- router
FROM runtime AS router
COPY --from=build-router /opt/venv /opt/venv
LABEL org.opencontainers.image.title="pdd-router" \
      org.opencontainers.image.description="vllm-router 0.1.17 and smg 1.13.0, the PD routers pdd-operator runs"
USER 65532:65532
# The router port is spec.router.port (default 8000) and metrics spec.router.metricsPort.
EXPOSE 8000 29000
# No entrypoint: the operator renders the command (`vllm-router` or `smg launch`), and a
# custom engine's router names its own (spec.router.command).
