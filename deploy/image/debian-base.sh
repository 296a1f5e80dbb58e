#!/bin/sh
# Makes a base image for the Dockerfile from Debian packages, for machines that reach a Debian
# package mirror but no image registry (the Dockerfile's default base, python:3.11-slim, comes
# from one). mmdebstrap builds a minimal Debian root (minbase + python3 + ca-certificates, no
# docs, man pages or locales); the container engine imports it as NAME. Then:
#
#   make image IMAGE_BASE=NAME      (docker build --build-arg BASE=NAME ...)
#
#   deploy/image/debian-base.sh ENGINE NAME [SUITE]
#
# ENGINE: docker, podman or buildah (buildah honours STORAGE_DRIVER and BUILDAH_ISOLATION from
# the environment). SUITE: default the host's own release (VERSION_CODENAME of /etc/os-release).
# An existing NAME is kept (like make's targets); REBUILD=1 makes it again (e.g. for Debian's
# security updates).
# Mirrors: the host's apt sources (/etc/apt/sources.list and sources.list.d), so the base is
# built from, and its apt later fetches from, the mirror this machine already uses; mmdebstrap's
# own default where the host has none. Needs root (mmdebstrap's root mode) and mmdebstrap.
#
# The image build needs python3 in the base, of the minor version the tree is built and run with
# (the build stage compiles the tree with the base's own python3, the runtime stage runs it with
# the same): Debian bookworm has 3.11, like python:3.11-slim.
set -eu

engine=${1:?usage: debian-base.sh ENGINE NAME [SUITE]}
name=${2:?usage: debian-base.sh ENGINE NAME [SUITE]}
suite=${3:-$(. /etc/os-release 2>/dev/null && echo "${VERSION_CODENAME:-}")}
[ -n "$suite" ] || { echo "debian-base: no SUITE given and none in /etc/os-release" >&2; exit 1; }
command -v mmdebstrap >/dev/null 2>&1 || {
    echo "debian-base: mmdebstrap is missing (Debian package mmdebstrap)" >&2
    exit 1
}

exists() {
    case $engine in
        buildah) buildah inspect --type image "$name" >/dev/null 2>&1 ;;
        podman) podman image exists "$name" ;;
        *) "$engine" image inspect "$name" >/dev/null 2>&1 ;;
    esac
}
if [ "${REBUILD:-0}" != 1 ] && exists; then
    echo "debian-base: $name exists (REBUILD=1 makes it again)"
    exit 0
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# The host's enabled apt sources, each passed as a file (mmdebstrap copies it into the root).
set --
[ -s /etc/apt/sources.list ] && grep -q '^[[:space:]]*deb' /etc/apt/sources.list \
    && set -- "$@" /etc/apt/sources.list
for f in /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources; do
    [ -f "$f" ] && set -- "$@" "$f"
done

echo "debian-base: $suite root with python3 (mmdebstrap, mirrors: ${*:-mmdebstrap default})"
# Docs, man pages and translations are left out as in Debian's slim images; copyright files stay.
# merged-/usr set up by mmdebstrap's hook, not by the usrmerge package (which brings perl).
mmdebstrap --quiet --variant=minbase --include=python3,ca-certificates \
    --hook-dir=/usr/share/mmdebstrap/hooks/maybe-merged-usr \
    --dpkgopt='path-exclude=/usr/share/doc/*' \
    --dpkgopt='path-include=/usr/share/doc/*/copyright' \
    --dpkgopt='path-exclude=/usr/share/man/*' \
    --dpkgopt='path-exclude=/usr/share/info/*' \
    --dpkgopt='path-exclude=/usr/share/locale/*' \
    --dpkgopt='path-exclude=/usr/share/lintian/*' \
    "$suite" "$work/root.tar" "$@"

# The same import for every engine: a one-step build from the tarball.
cat > "$work/Dockerfile" <<'EOF'
FROM scratch
ADD root.tar /
ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8
CMD ["python3"]
EOF
case $engine in
    buildah) buildah bud --quiet -t "$name" "$work" >/dev/null ;;
    docker | podman) "$engine" build --quiet -t "$name" "$work" >/dev/null ;;
    *) echo "debian-base: unknown engine $engine (docker, podman or buildah)" >&2; exit 1 ;;
esac
echo "debian-base: $name ($(du -h "$work/root.tar" | cut -f1) root from Debian $suite)"
