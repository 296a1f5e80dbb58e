#!/bin/sh
# Prints the container engine `make image` and `make image-base` use: $ENGINE if set, else the
# first that works here of docker (its daemon reachable), podman and buildah. Exit 1 with the
# reason when there is none.
set -eu

if [ -n "${ENGINE:-}" ]; then
    if ! command -v "$ENGINE" >/dev/null 2>&1; then
        echo "image: ENGINE=$ENGINE is not installed" >&2
        exit 1
    fi
    echo "$ENGINE"
    exit 0
fi
for e in docker podman buildah; do
    command -v "$e" >/dev/null 2>&1 || continue
    if [ "$e" = docker ] && ! docker info >/dev/null 2>&1; then
        echo "image: docker is installed but its daemon is not reachable; trying the others" >&2
        continue
    fi
    echo "$e"
    exit 0
done
echo "image: no usable container engine (docker, podman or buildah: Debian packages docker.io," \
    "podman, buildah); 'make image-tree' builds the same file tree without one" >&2
exit 1
