#!/usr/bin/env bash
# Installs the distribution packages real test-bed nodes need when they are missing: runc (the
# OCI runtime containerd's shim calls), the CNI plugins (bridge, host-local, loopback) and a
# static busybox (the bed's shell image is built from it). Called by `make controlplane` and
# .ci/run. Without root it only reports what is missing: the stand-in nodes do not need these.
set -euo pipefail

need=()
command -v runc >/dev/null 2>&1 || need+=(runc)
[[ -x /usr/lib/cni/bridge || -x /opt/cni/bin/bridge ]] || need+=(containernetworking-plugins)
[[ -x /bin/busybox ]] || need+=(busybox-static)
command -v ip >/dev/null 2>&1 || need+=(iproute2)
((${#need[@]})) || exit 0
if [[ $(id -u) != 0 ]]; then
    echo "node-packages: missing ${need[*]} (needed for real test-bed nodes only); install them as root" >&2
    exit 0
fi
echo "node-packages: installing ${need[*]}"
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
