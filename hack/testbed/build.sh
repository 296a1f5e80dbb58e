#!/usr/bin/env bash
# Builds the real control plane (etcd, kube-apiserver, kube-scheduler, kube-controller-manager) and
# helm from the official Go modules at one pinned release, into a cache keyed by version.
#
# Why a throwaway module: k8s.io/kubernetes points its staging modules (k8s.io/api, ...) at local
# directories with replace lines, so `go install k8s.io/kubernetes/cmd/...@v1.X` refuses to build.
# We write a module that requires k8s.io/kubernetes and replaces each staging module with its
# published v0.X twin; the list is read from the tag's own go.mod so it stays exact.
#
# Output: $VGPU_DRA_CACHE/k8s/$K8S_VERSION/bin/{etcd,kube-apiserver,kube-scheduler,
#         kube-controller-manager,helm} and a `.complete` stamp. A warm run is a no-op.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=versions.env
source "$here/versions.env"

cache=${VGPU_DRA_CACHE:-$HOME/.cache/vgpu-dra}
out="$cache/k8s/$K8S_VERSION"
bin="$out/bin"
stamp="$out/.complete-$K8S_VERSION-$HELM_VERSION"
if [[ -f $stamp && ${1:-} != --force ]]; then
    echo "control plane $K8S_VERSION already built in $bin"
    exit 0
fi

# One build at a time per version (CI and a developer, or two engineers, may start one at
# once): the second waits, then finds the stamp and returns.
mkdir -p "$out"
exec 9>"$out/.build.lock"
if ! flock -n 9; then
    echo "another build of $K8S_VERSION is running; waiting for it" >&2
    flock 9
fi
if [[ -f $stamp && ${1:-} != --force ]]; then
    echo "control plane $K8S_VERSION already built in $bin"
    exit 0
fi

export GOMODCACHE="$cache/go/mod"
export GOCACHE="$cache/go/build"
export GOFLAGS="-mod=mod -buildvcs=false"
export CGO_ENABLED=0
export GOTOOLCHAIN=${GOTOOLCHAIN:-auto}
mkdir -p "$bin" "$GOMODCACHE" "$GOCACHE"

work="$out/src"
rm -rf "$work"
mkdir -p "$work"
cd "$work"

log() { printf '[build %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

staging_version="v0.${K8S_VERSION#v1.}"
log "kubernetes $K8S_VERSION (staging $staging_version), helm $HELM_VERSION -> $bin"

go mod init vgpu-dra.local/testbed >/dev/null 2>&1
# Fetch the tag's go.mod to learn the staging list and the go directive.
go mod download -json "k8s.io/kubernetes@$K8S_VERSION" > k8s.json
k8s_gomod=$(python3 -c 'import json,sys; print(json.load(open("k8s.json"))["GoMod"])')
go_directive=$(awk '$1=="go"{print $2; exit}' "$k8s_gomod")
staging=$(awk '/=> \.\/staging\/src\//{print $1}' "$k8s_gomod")
[[ -n $staging ]] || { echo "no staging modules found in $k8s_gomod" >&2; exit 1; }

{
    echo "module vgpu-dra.local/testbed"
    echo
    echo "go $go_directive"
    echo
    echo "require k8s.io/kubernetes $K8S_VERSION"
    echo
    echo "replace ("
    for m in $staging; do echo "	$m => $m $staging_version"; done
    echo ")"
} > go.mod
cat > tools.go <<'GO'
//go:build tools

package tools

import (
	_ "go.etcd.io/etcd/server/v3"
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
)
GO

log "resolving modules"
go mod tidy -e >/dev/null 2>tidy.log || { cat tidy.log >&2; exit 1; }

major=${K8S_VERSION#v}; major=${major%%.*}
minor=${K8S_VERSION#v*.}; minor=${minor%%.*}
vpkg=k8s.io/component-base/version
ldflags="-s -w -X $vpkg.gitVersion=$K8S_VERSION -X $vpkg.gitMajor=$major -X $vpkg.gitMinor=$minor \
 -X $vpkg.gitTreeState=clean -X $vpkg.buildDate=1970-01-01T00:00:00Z \
 -X k8s.io/client-go/pkg/version.gitVersion=$K8S_VERSION"

for cmd in kube-apiserver kube-scheduler kube-controller-manager; do
    log "building $cmd"
    go build -trimpath -ldflags "$ldflags" -o "$bin/$cmd.tmp" "k8s.io/kubernetes/cmd/$cmd"
    mv "$bin/$cmd.tmp" "$bin/$cmd"
done
log "building etcd"
go build -trimpath -ldflags "-s -w" -o "$bin/etcd.tmp" go.etcd.io/etcd/server/v3
mv "$bin/etcd.tmp" "$bin/etcd"

log "building helm $HELM_VERSION"
GOFLAGS=-buildvcs=false GOBIN="$out/helm-bin" go install -trimpath \
    -ldflags "-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION" \
    "helm.sh/helm/v3/cmd/helm@$HELM_VERSION"
mv "$out/helm-bin/helm" "$bin/helm"
rmdir "$out/helm-bin" 2>/dev/null || true

"$bin/kube-apiserver" --version
"$bin/etcd" --version | head -1
"$bin/helm" version --short
rm -f "$out"/.complete-*
touch "$stamp"
log "done"
