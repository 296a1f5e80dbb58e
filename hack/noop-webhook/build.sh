#!/usr/bin/env bash
# Builds hack/noop-webhook (standard library only) into $VGPU_DRA_CACHE/noop-webhook/<hash of the
# sources>/noop-webhook, so a warm run is a no-op. Prints the binary's path on its last line.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cache=${VGPU_DRA_CACHE:-$HOME/.cache/vgpu-dra}
hash=$(cd "$here" && cat go.mod ./*.go build.sh ../go-env.sh | sha256sum | cut -c1-16)
binary="$cache/noop-webhook/$hash/noop-webhook"
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
