# vgpu-dra image: the kubelet plugin, the controller and the hook library (libvgpu.so) that the
# plugin's init container installs on each node. Build with `make image` (docker, podman or
# buildah). The file tree is made by deploy/image/build-tree.sh, the same script `make image-tree`
# runs without a container engine.

# ---- build: the wheel with its Cython extension, libvgpu.so, the runtime tree under /out -----
FROM python:3.11-slim AS build
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc libc6-dev libssl-dev make \
    && rm -rf /var/lib/apt/lists/*
RUN python -m pip install --no-cache-dir "setuptools>=68" wheel "cython>=3.0"
WORKDIR /src
COPY pyproject.toml setup.py README.md ./
COPY dra_driver/ dra_driver/
COPY kubelet_plugin/ kubelet_plugin/
COPY controller/ controller/
COPY vgpu_testbed/ vgpu_testbed/
COPY vgpu_hook/ vgpu_hook/
COPY deploy/image/ deploy/image/
RUN sh deploy/image/build-tree.sh /out python

# ---- runtime: python, the tree, nothing else ------------------------------------------------
FROM python:3.11-slim
LABEL org.opencontainers.image.title="vgpu-dra" \
      org.opencontainers.image.description="DRA driver sharing NVIDIA GPUs with per-container memory and compute caps" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /out/ /
# pip, setuptools and wheel are not needed at run time.
RUN python -m pip uninstall --yes --quiet pip setuptools wheel 2>/dev/null || true
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
# The controller runs as this user; the kubelet plugin's DaemonSet sets runAsUser 0 (it writes
# the kubelet's plugin directories and CDI specs).
USER 65532:65532
ENTRYPOINT ["vgpu-dra"]
CMD ["--help"]
