#!/bin/sh
# Builds the vgpu-dra runtime file tree under ROOT: what the container image holds, and what
# `make image-tree` produces without a container engine. The Dockerfile's build stage runs this
# same script with ROOT=/out and copies /out into the runtime stage, so both trees are one.
#
#   deploy/image/build-tree.sh ROOT [PYTHON]
#
# ROOT/opt/vgpu-dra/site-packages   the wheel (with its Cython extension) and its dependencies
# ROOT/opt/vgpu-dra/lib/libvgpu.so  the hook library, plus libvgpu.so.contract (its contract note)
# ROOT/usr/local/bin/vgpu-dra       launcher: python3 on PATH (or $VGPU_DRA_PYTHON) with -S -s, so
#                                   only the standard library and the tree are importable;
#                                   relocatable (finds ROOT from its own path)
# ROOT/usr/local/bin/vgpu-dra-install-hook, vgpu-dra-probe-socket
#
# PYTHON builds the wheel and must have setuptools, wheel and cython (default: python3). The
# tree runs on the python3 found on PATH at run time, which must be the same minor version.
set -eu

root=${1:?usage: build-tree.sh ROOT [PYTHON]}
python=${2:-python3}
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)

mkdir -p "$root"
root=$(cd "$root" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

echo "build-tree: hook library"
make --no-print-directory -C "$repo/vgpu_hook" build/libvgpu.so

echo "build-tree: wheel (Cython extension included)"
# Built from a copy so the worktree gets no build/ or egg-info litter and local .so files
# from `make native` cannot slip in.
mkdir -p "$work/src"
(cd "$repo" && tar cf - --exclude=./.venv --exclude=./build --exclude='*.so' \
    --exclude='*.egg-info' --exclude=__pycache__ --exclude=./.git --exclude=./vgpu_hook/build \
    --exclude=./hack/fakegpu/build pyproject.toml setup.py README.md dra_driver kubelet_plugin \
    controller vgpu_testbed) | (cd "$work/src" && tar xf -)
"$python" -m pip wheel --quiet --no-deps --no-build-isolation -w "$work/wheel" "$work/src"

echo "build-tree: install into $root/opt/vgpu-dra/site-packages"
site="$root/opt/vgpu-dra/site-packages"
rm -rf "$site"
"$python" -m pip install --quiet --no-warn-script-location --target "$site" "$work"/wheel/*.whl
# The test bed (dev cluster, simulated nodes) is not part of the product image; neither is the
# kubernetes package's asyncio client (68 MB, never imported: dra_driver/kube.py uses the
# synchronous one) nor the aiohttp stack only it imports.
# tests/integration/deploy/test_image_tree.py imports every product module from the tree, so a
# pruned module still in use fails there.
rm -rf "$site/vgpu_testbed" "$site/bin" "$site/kubernetes/aio"
for dist in aiohttp aiohttp_retry aiosignal aiohappyeyeballs frozenlist multidict propcache yarl; do
    rm -rf "$site/$dist" "$site/$dist"-*.dist-info
done

lib="$root/opt/vgpu-dra/lib"
mkdir -p "$lib"
install -m 0644 "$repo/vgpu_hook/build/libvgpu.so" "$lib/libvgpu.so"
region_version=$(sed -n 's/^#define VGPU_REGION_VERSION \([0-9]*\)u.*/\1/p' \
    "$repo/vgpu_hook/include/region.h")
{
    echo "# Contract of the vgpu-dra hook library; vgpu-dra-install-hook checks the library"
    echo "# against it before installing both on a node."
    echo "library libvgpu.so"
    echo "size $(wc -c < "$lib/libvgpu.so" | tr -d ' ')"
    echo "sha256 $(sha256sum "$lib/libvgpu.so" | cut -d' ' -f1)"
    echo "vgpu-conf-version 1"
    echo "region-version $region_version"
    echo "container-path /usr/local/vgpu-dra/lib/libvgpu.so"
} > "$lib/libvgpu.so.contract"
chmod 0644 "$lib/libvgpu.so.contract"

bin="$root/usr/local/bin"
mkdir -p "$bin"
cat > "$bin/vgpu-dra" <<'LAUNCHER'
#!/bin/sh
# vgpu-dra from the image tree: the packages live in <root>/opt/vgpu-dra/site-packages.
root=$(cd "$(dirname "$(readlink -f "$0")")/../../.." && pwd)
PYTHONPATH="$root/opt/vgpu-dra/site-packages" exec "${VGPU_DRA_PYTHON:-python3}" -S -s -m dra_driver.cli "$@"
LAUNCHER
chmod 0755 "$bin/vgpu-dra"
install -m 0755 "$here/install-hook.sh" "$bin/vgpu-dra-install-hook"
install -m 0755 "$here/probe-socket.py" "$bin/vgpu-dra-probe-socket"
echo "build-tree: done: $(du -sh "$root" | cut -f1) in $root"
