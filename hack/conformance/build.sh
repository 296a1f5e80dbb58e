#!/usr/bin/env bash
# Builds the Go conformance tools (kubeletclient, cdicheck) against the real upstream modules:
# k8s.io/kubelet's generated gRPC code and the CDI reference library. Binaries are cached under
# $VGPU_DRA_CACHE/conformance/<hash of the sources>/bin, so a warm run is a no-op; module and
# build caches are shared with hack/testbed/build.sh. Prints the bin directory on its last line.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cache=${VGPU_DRA_CACHE:-$HOME/.cache/vgpu-dra}
hash=$(cd "$here" && cat go.mod go.sum ./*/*.go build.sh ../go-env.sh | sha256sum | cut -c1-16)
bin="$cache/conformance/$hash/bin"
if [[ -x $bin/kubeletclient && -x $bin/cdicheck ]]; then
    echo "$bin"
    exit 0
fi

# shellcheck source=../go-env.sh
source "$here/../go-env.sh"
go_env "$cache" readonly
mkdir -p "$bin"

# go.mod and go.sum pin every module (verified against the checksum database when they were
# tidied); -mod=readonly means a build never rewrites them.
cd "$here"
for tool in kubeletclient cdicheck; do
    go build -trimpath -ldflags "-s -w" -o "$bin/$tool.tmp" "./$tool"
    mv "$bin/$tool.tmp" "$bin/$tool"
done
echo "$bin"
