# vgpu-dra image: the kubelet plugin, the controller and the hook library (libvgpu.so) that the
# plugin's init container installs on each node. Build with `make image` (docker, podman or
# buildah). The file tree is made by deploy/image/build-tree.sh, the same script `make image-tree`
# runs without a container engine.
#
# BASE: the image both stages start from; it must have python3 (>= 3.11) and apt. Default
# python:3.11-slim. Where no image registry is reachable, `make image-base` makes one from
# Debian packages (deploy/image/debian-base.sh), and `make image IMAGE_BASE=vgpu-dra-base:<suite>`
# builds on it. The tree is compiled by the base's python3 and run by the same interpreter.
ARG BASE=python:3.11-slim

# ---- build: the wheel with its Cython extension, libvgpu.so, the runtime tree under /out -----
FROM ${BASE} AS build
# What the base lacks of: a C compiler, make, OpenSSL's headers, and where python3 is Debian's
# own (not python:*'s), its headers and venv.
RUN set -eu; \
    pkgs="gcc libc6-dev libssl-dev make"; \
    python3 -c 'import ensurepip' 2>/dev/null || pkgs="$pkgs python3-venv"; \
    [ -f "$(python3 -c 'import sysconfig; print(sysconfig.get_path("include"))')/Python.h" ] \
        || pkgs="$pkgs python3-dev"; \
    apt-get update; \
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends $pkgs; \
    rm -rf /var/lib/apt/lists/*
# The build's tools in a venv of the base's python3. pip trusts the CA bundle of the optional
# build secret pip-cert (e.g. a TLS-inspecting proxy's; `make image` passes the file PIP_CERT
# names); it is mounted for the RUN only and never stored in a layer.
RUN --mount=type=secret,id=pip-cert,required=false \
    if [ -s /run/secrets/pip-cert ]; then export PIP_CERT=/run/secrets/pip-cert; fi; \
    python3 -m venv /opt/build \
    && /opt/build/bin/pip install --no-cache-dir --disable-pip-version-check \
        "setuptools>=68" wheel "cython>=3.0"
WORKDIR /src
COPY pyproject.toml setup.py README.md ./
COPY dra_driver/ dra_driver/
COPY kubelet_plugin/ kubelet_plugin/
COPY controller/ controller/
COPY vgpu_testbed/ vgpu_testbed/
COPY vgpu_hook/ vgpu_hook/
COPY deploy/image/ deploy/image/
RUN --mount=type=secret,id=pip-cert,required=false \
    if [ -s /run/secrets/pip-cert ]; then export PIP_CERT=/run/secrets/pip-cert; fi; \
    PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 \
    sh deploy/image/build-tree.sh /out /opt/build/bin/python

# ---- runtime: the base's python3 and the tree, nothing else ---------------------------------
FROM ${BASE}
LABEL org.opencontainers.image.title="vgpu-dra" \
      org.opencontainers.image.description="DRA driver sharing NVIDIA GPUs with per-container memory and compute caps" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /out/ /
# pip, setuptools and wheel of the default base are not needed at run time (a Debian base from
# deploy/image/debian-base.sh has none).
RUN if python3 -m pip --version >/dev/null 2>&1; then \
        python3 -m pip uninstall --yes --quiet pip setuptools wheel; \
    fi
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
# The controller runs as this user; the kubelet plugin's DaemonSet sets runAsUser 0 (it writes
# the kubelet's plugin directories and CDI specs).
USER 65532:65532
ENTRYPOINT ["vgpu-dra"]
CMD ["--help"]
