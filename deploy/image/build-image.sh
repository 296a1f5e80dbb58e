#!/bin/sh
# Builds the Dockerfile with the engine deploy/image/engine.sh picks and writes the image as an
# archive that a node loads without a registry (`ctr -n k8s.io images import ARCHIVE`,
# `nerdctl load -i`, `docker load -i`, `podman load -i`). `make image` runs it.
# The archive is in Docker's format (`docker save`): every one of those loads it under the
# normalised name the kubelet asks for (docker.io/library/vgpu-dra:0.1.0 for vgpu-dra:0.1.0);
# containerd keeps an OCI archive's short name as it is, which no pod spec matches.
#
#   deploy/image/build-image.sh IMAGE ARCHIVE [BASE]
#
# BASE (optional): the Dockerfile's build argument BASE (default python:3.11-slim there).
# PIP_CERT (environment, optional): a CA bundle pip must trust (a TLS-inspecting proxy's), given
# to the build as the secret pip-cert; nothing of it stays in the image.
# IMAGE_BUILD_FLAGS (environment, optional): more flags for the engine's build, e.g. --no-cache.
# Prints the image's size (the engine's figure) and the archive's.
set -eu

image=${1:?usage: build-image.sh IMAGE ARCHIVE [BASE]}
archive=${2:?usage: build-image.sh IMAGE ARCHIVE [BASE]}
base=${3:-}
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
engine=$(sh "$here/engine.sh")

# shellcheck disable=SC2086 # IMAGE_BUILD_FLAGS is a list of flags
set -- -t "$image" -f "$repo/Dockerfile" ${IMAGE_BUILD_FLAGS:-}
[ -n "$base" ] && set -- "$@" --build-arg "BASE=$base"
if [ -n "${PIP_CERT:-}" ] && [ -s "$PIP_CERT" ]; then
    set -- "$@" --secret "id=pip-cert,src=$PIP_CERT"
fi
echo "image: building $image with $engine${base:+ from $base}"
case $engine in
    # --layers: reuse unchanged steps on the next build, as docker and podman do by default.
    buildah) buildah bud --layers "$@" "$repo" ;;
    *) "$engine" build "$@" "$repo" ;;
esac

mkdir -p "$(dirname "$archive")"
rm -f "$archive"
case $engine in
    docker) docker save -o "$archive" "$image" ;;
    podman) podman save --quiet --format docker-archive -o "$archive" "$image" ;;
    buildah) buildah push --quiet "$image" "docker-archive:$archive:$image" >/dev/null ;;
esac
case $engine in
    buildah) size=$(buildah images --format '{{.Size}}' "$image") ;;
    *) size="$("$engine" image inspect --format '{{.Size}}' "$image") bytes" ;;
esac
echo "image: $image built: $size; archive $archive ($(du -h "$archive" | cut -f1))"
