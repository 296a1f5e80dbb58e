#!/usr/bin/env bash
# Builds the real control plane (etcd, kube-apiserver, kube-scheduler, kube-controller-manager),
# helm, and the real node components (kubelet; containerd, containerd-shim-runc-v2 and ctr) from
# the official Go modules at pinned releases, into a cache keyed by version.
#
# Why a throwaway module: k8s.io/kubernetes points its staging modules (k8s.io/api, ...) at local
# directories with replace lines, so `go install k8s.io/kubernetes/cmd/...@v1.X` refuses to build.
# We write a module that requires k8s.io/kubernetes and replaces each staging module with its
# published v0.X twin; the list is read from the tag's own go.mod so it stays exact.
#
# Output: $VGPU_DRA_CACHE/k8s/$K8S_VERSION/bin/{etcd,kube-apiserver,kube-scheduler,
#         kube-controller-manager,helm,kubelet} and
#         $VGPU_DRA_CACHE/containerd/$CONTAINERD_VERSION/bin/{containerd,containerd-shim-runc-v2,ctr},
#         each part with its own `.complete-*` stamp. A warm run is a no-op. runc and the CNI
#         plugins come from the distribution's packages (`runc`, `containernetworking-plugins`).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=versions.env
source "$here/versions.env"

cache=${VGPU_DRA_CACHE:-$HOME/.cache/vgpu-dra}
out="$cache/k8s/$K8S_VERSION"
bin="$out/bin"
stamp="$out/.complete-$K8S_VERSION-$HELM_VERSION"
ctrd_out="$cache/containerd/$CONTAINERD_VERSION"
ctrd_bin="$ctrd_out/bin"
node_stamp="$ctrd_out/.complete-node-$K8S_VERSION-$CONTAINERD_VERSION"
force=${1:-}
all_built() { [[ -f $stamp && -f $node_stamp && $force != --force ]]; }
if all_built; then
    echo "control plane $K8S_VERSION and node components already built in $bin, $ctrd_bin"
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
if all_built; then
    echo "control plane $K8S_VERSION and node components already built in $bin, $ctrd_bin"
    exit 0
fi

# shellcheck source=../go-env.sh
source "$here/../go-env.sh"
go_env "$cache" mod
mkdir -p "$bin"

log() { printf '[build %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

staging_version="v0.${K8S_VERSION#v1.}"
major=${K8S_VERSION#v}; major=${major%%.*}
minor=${K8S_VERSION#v*.}; minor=${minor%%.*}
vpkg=k8s.io/component-base/version
ldflags="-s -w -X $vpkg.gitVersion=$K8S_VERSION -X $vpkg.gitMajor=$major -X $vpkg.gitMinor=$minor \
 -X $vpkg.gitTreeState=clean -X $vpkg.buildDate=1970-01-01T00:00:00Z \
 -X k8s.io/client-go/pkg/version.gitVersion=$K8S_VERSION"

# k8s_module DIR IMPORT...: a fresh throwaway module in DIR that requires k8s.io/kubernetes with
# every staging module replaced by its published twin, resolved for the given imports.
k8s_module() {
    local work=$1; shift
    rm -rf "$work"
    mkdir -p "$work"
    cd "$work"
    go mod init vgpu-dra.local/testbed >/dev/null 2>&1
    # Fetch the tag's go.mod to learn the staging list and the go directive.
    go mod download -json "k8s.io/kubernetes@$K8S_VERSION" > k8s.json
    local k8s_gomod go_directive staging
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
    {
        echo "//go:build tools"
        echo
        echo "package tools"
        echo
        echo "import ("
        for imp in "$@"; do echo "	_ \"$imp\""; done
        echo ")"
    } > tools.go
    log "resolving modules"
    go mod tidy -e >/dev/null 2>tidy.log || { cat tidy.log >&2; exit 1; }
}

build_control_plane() {
    log "kubernetes $K8S_VERSION (staging $staging_version), helm $HELM_VERSION -> $bin"
    k8s_module "$out/src" go.etcd.io/etcd/server/v3 k8s.io/kubernetes/cmd/kube-apiserver \
        k8s.io/kubernetes/cmd/kube-controller-manager k8s.io/kubernetes/cmd/kube-scheduler
    local cmd
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
}

# The node: the kubelet at the control plane's version (same throwaway module recipe, so its
# packages come from the control plane's build cache) and containerd 2.x (CDI on by default)
# with its runc shim and ctr. Static like the rest; btrfs needs cgo and the bed does not use it.
build_node() {
    log "kubelet $K8S_VERSION -> $bin, containerd $CONTAINERD_VERSION -> $ctrd_bin"
    k8s_module "$out/src-node" k8s.io/kubernetes/cmd/kubelet
    log "building kubelet"
    go build -trimpath -ldflags "$ldflags" -o "$bin/kubelet.tmp" k8s.io/kubernetes/cmd/kubelet
    mv "$bin/kubelet.tmp" "$bin/kubelet"
    "$bin/kubelet" --version

    mkdir -p "$ctrd_bin"
    local mod=github.com/containerd/containerd/v2 cmd
    local cflags="-s -w -X $mod/version.Version=$CONTAINERD_VERSION -X $mod/version.Revision=module"
    for cmd in containerd containerd-shim-runc-v2 ctr; do
        log "building $cmd"
        GOFLAGS=-buildvcs=false GOBIN="$ctrd_out/gobin" go install -trimpath -tags no_btrfs -ldflags "$cflags" \
            "$mod/cmd/$cmd@$CONTAINERD_VERSION"
        mv "$ctrd_out/gobin/$cmd" "$ctrd_bin/$cmd"
    done
    rmdir "$ctrd_out/gobin" 2>/dev/null || true
    "$ctrd_bin/containerd" --version
    rm -f "$ctrd_out"/.complete-*
    touch "$node_stamp"
}

if [[ ! -f $stamp || $force == --force ]]; then
    build_control_plane
fi
if [[ ! -f $node_stamp || $force == --force ]]; then
    build_node
fi
log "done"
