# Sourced by the Go build scripts under hack/ (testbed/build.sh, conformance/build.sh): one Go
# environment for both, so they share the module and build caches under $VGPU_DRA_CACHE/go.
# go_env CACHE MODE: static binaries (no cgo), no VCS stamping, `-mod=MODE` (mod: may update
# go.sum while resolving upstream modules; readonly: go.mod/go.sum are pinned and never rewritten).
go_env() {
    export GOMODCACHE="$1/go/mod"
    export GOCACHE="$1/go/build"
    export GOFLAGS="-mod=$2 -buildvcs=false"
    export CGO_ENABLED=0
    export GOTOOLCHAIN=${GOTOOLCHAIN:-auto}
    mkdir -p "$GOMODCACHE" "$GOCACHE"
}
