#!/usr/bin/env bash
# Downloads, here (with the internet), every wheel bench/gpu_check.sh installs on a GPU host that has none:
# KvikIO for CUDA 13 without cupy, and ckptqual's own dependencies for CPython 3.12 (torch is on that host already).
# They land in bench/wheels/ (git-ignored); the total must stay under the 64 MiB a device run carries.
#
#     bash bench/gpu_wheels.sh            # then: bash bench/gpu_check.sh on the GPU host, carrying bench/wheels
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
WHEELS=${WHEELS:-$ROOT/bench/wheels}
KVIKIO_VERSION=${KVIKIO_VERSION:-26.10.0}
LIMIT_MIB=64
mkdir -p "$WHEELS"

TAGS=(--only-binary=:all: --python-version 3.12 --implementation cp --abi cp312
      --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64
      --platform manylinux2014_x86_64)

# KvikIO and what `import kvikio` needs, without its cupy dependency (cupy-cuda13x alone is a 69 MB wheel).
python3 -m pip download --no-deps "${TAGS[@]}" --dest "$WHEELS" \
    "kvikio-cu13==$KVIKIO_VERSION" "libkvikio-cu13==$KVIKIO_VERSION" nvidia-cufile "rapids-logger==0.3.*" \
    cuda-pathfinder

# ckptqual's dependencies (pyproject.toml) but torch, resolved for that host.
python3 -m pip download "${TAGS[@]}" --dest "$WHEELS" \
    "pytest>=8.0" "pytest-benchmark>=4.0" "pytest-xdist>=3.5" "hypothesis>=6.100" "numpy>=2,<3" \
    "cryptography>=41" "isal>=1.6" packaging

total_kib=$(du -sk "$WHEELS" | cut -f1)
echo "bench/wheels: $(ls "$WHEELS" | wc -l) wheels, $((total_kib / 1024)) MiB (a device run carries at most $LIMIT_MIB MiB)"
if ((total_kib > LIMIT_MIB * 1024)); then
    echo "ERROR: $WHEELS is larger than $LIMIT_MIB MiB: remove what the GPU host has already" >&2
    exit 1
fi
