#!/usr/bin/env bash
# Regenerates the Python gRPC stubs of the kubelet's plugin APIs from kubelet_plugin/proto/*.proto.
#
# The stubs are committed (tests/unit/kubelet_plugin/test_proto.py regenerates them into a temp dir
# and fails on any difference), so a fresh clone runs without protoc. Usage:
#   hack/gen-protos.sh            regenerate in place
#   hack/gen-protos.sh OUT_DIR    write into OUT_DIR/kubelet_plugin/proto/ instead (for the check)
# Protos are compiled with the repo root as include path so generated imports read
# `from kubelet_plugin.proto import ..._pb2`.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
python=${PYTHON:-$root/.venv/bin/python}
out=${1:-$root}
mkdir -p "$out/kubelet_plugin/proto"

cd "$root"
"$python" -m grpc_tools.protoc -I . \
    --python_out="$out" --pyi_out="$out" --grpc_python_out="$out" \
    kubelet_plugin/proto/*.proto
