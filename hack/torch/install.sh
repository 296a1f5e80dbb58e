#!/usr/bin/env bash
# Installs the pinned PyTorch of requirements.txt (torch from PyPI, unmodified, with the NVIDIA
# libraries its CUDA build links) into an environment of its own,
# $VGPU_DRA_CACHE/torch/<torch version>-<hash of requirements.txt>, for the framework tests
# (tests/integration/frameworks, docs/frameworks.md). Cached: a warm run is a no-op. pip reaches
# the package index configured in the environment (PIP_INDEX_URL, proxies); nothing else is
# fetched. Prints the environment's python on its last line. `make torch` runs it.
# With --check it installs nothing: prints the python if the environment is complete, else exits 3
# (the tests skip then).
#
# No CUDA runtime is installed: the simulated GPUs' own libcudart.so.13 (hack/fakegpu) is found
# through LD_LIBRARY_PATH, as on a real GPU machine NVIDIA's would be. A machine with a GPU adds
# nvidia-cuda-runtime==13.2.86 to the environment (docs/frameworks.md, "On a real GPU").
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cache=${VGPU_DRA_CACHE:-$HOME/.cache/vgpu-dra}
python=${PYTHON:-python3}
version=$(sed -n 's/^torch==//p' "$here/requirements.txt")
hash=$(sha256sum <"$here/requirements.txt" | cut -c1-12)
root="$cache/torch/$version-$hash"
if [[ -f $root/.complete ]]; then
    echo "$root/bin/python"
    exit 0
fi
if [[ ${1:-} == --check ]]; then
    echo "torch: $root is not installed (make torch)" >&2
    exit 3
fi

mkdir -p "$cache/torch"
# One installer at a time (two test sessions may ask at once); the second finds it complete.
exec 9>"$cache/torch/.lock"
flock 9
if [[ -f $root/.complete ]]; then
    echo "$root/bin/python"
    exit 0
fi
rm -rf "$root.tmp"
start=$(date +%s.%N)
"$python" -m venv "$root.tmp"
# --no-deps: exactly the pinned set (torch's metadata would add NVIDIA's CUDA runtime, triton...).
PIP_DISABLE_PIP_VERSION_CHECK=1 "$root.tmp/bin/python" -m pip install --quiet --no-deps \
    --no-cache-dir --only-binary :all: -r "$here/requirements.txt" >&2
# A venv records its own path in its scripts: move the finished tree, then rewrite the few
# absolute paths (activate, pip's entry points) rather than leave them pointing at .tmp.
mv "$root.tmp" "$root"
grep -rlF "$root.tmp" "$root/bin" "$root/pyvenv.cfg" | xargs -r sed -i "s|$root.tmp|$root|g"
"$root/bin/python" - "$start" "$root" >&2 <<'PY'
import sys, time, subprocess
start, root = float(sys.argv[1]), sys.argv[2]
size = int(subprocess.run(["du", "-sb", root], capture_output=True, text=True, check=True).stdout.split()[0])
print(f"torch: installed {size / 2**30:.2f} GiB in {time.time() - start:.0f} s into {root}")
PY
touch "$root/.complete"
echo "$root/bin/python"
