#!/usr/bin/env bash
# Builds hack/prepare-floor (the floor of bench/prepare_bench.py: a kubelet plugin on the upstream
# k8s.io/dynamic-resource-allocation helper) into $VGPU_DRA_CACHE/prepare-floor/<hash of the
# sources>/prepare-floor, so a warm run is a no-op. go.mod and go.sum pin every module; module and
# build caches are shared with the other Go tools under hack/. Prints the binary's path on its
# last line.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cache=${VGPU_DRA_CACHE:-$HOME/.cache/vgpu-dra}
hash=$(cd "$here" && cat go.mod go.sum ./*.go build.sh ../go-env.sh | sha256sum | cut -c1-16)
binary="$cache/prepare-floor/$hash/prepare-floor"
if [[ -x $binary ]]; then
    echo "$binary"
    exit 0
fi

# shellcheck source=../go-env.sh
source "$here/../go-env.sh"
go_env "$cache" readonly
mkdir -p "$(dirname "$binary")"
cd "$here"
go build -trimpath -ldflags "-s -w" -o "$binary.tmp" .
mv "$binary.tmp" "$binary"
echo "$binary"
