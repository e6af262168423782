#!/usr/bin/env bash
# The GPU check, in one call of at most 8 minutes: what the GPU and GDS report, the read sweep's gpu-direct,
# cpu-gpu and cpu-only cells on small files, a verified restore of a small checkpoint into GPU memory, and
# KvikIO's own reads of sweep files as the reference. Tables go to $OUT (default ./gpu-check-out): summary.md
# and one file per step. Where a part cannot run (no GPU, no KvikIO, no GDS) it prints `SKIP <part>: <reason>`.
#
# A GPU host without internet gets its KvikIO (CUDA 13) and ckptqual's dependencies from bench/wheels/, made
# here by bench/gpu_wheels.sh; they are installed into a temporary directory, only where something is missing.
#
#     bash bench/gpu_wheels.sh                      # where there is internet
#     OUT=/tmp/gpu-out bash bench/gpu_check.sh      # on the GPU host
# Settings: GPU_CHECK_DIR (where the files go, default /var/tmp: put it on the drive under test),
# GPU_CHECK_FILE_BYTES (sweep file size, default 64M), GPU_CHECK_SECONDS (total budget, default 480).
set -uo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-$PWD/gpu-check-out}
FILE_BYTES=${GPU_CHECK_FILE_BYTES:-64M}
DEADLINE=$((SECONDS + ${GPU_CHECK_SECONDS:-480}))
mkdir -p "$OUT"
WORK=$(mktemp -d "${GPU_CHECK_DIR:-/var/tmp}/ckptqual-gpu-check.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
SUMMARY=$OUT/summary.md
: >"$SUMMARY"
status=0

say() { echo "$*" | tee -a "$SUMMARY"; }

# step NAME SECONDS COMMAND...: runs COMMAND with at most SECONDS (less if the budget is nearly spent), output
# into $OUT/NAME.txt and the summary; a step that fails or runs out of time is said so and fails the check.
step() {
    local name=$1 limit=$2 left=$((DEADLINE - SECONDS))
    shift 2
    ((left < limit)) && limit=$left
    if ((limit < 15)); then
        say "SKIP $name: the check's time budget is spent"
        return 0
    fi
    timeout --kill-after=10 "$limit" "$@" >"$OUT/$name.txt" 2>&1
    local rc=$?
    grep -v '^STATUS ' "$OUT/$name.txt" | tee -a "$SUMMARY"
    if ((rc == 124 || rc == 137)); then
        say "FAILED $name: ran past its ${limit} s"
        status=1
    elif ((rc != 0)); then
        say "FAILED $name: exit code $rc (see $OUT/$name.txt)"
        status=1
    fi
    return 0
}

say "# ckptqual GPU check, $(date -u +%Y-%m-%dT%H:%M:%SZ), $(hostname)"
say ""
if command -v nvidia-smi >/dev/null 2>&1; then
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | sed 's/^/GPU (nvidia-smi): /' |
        tee -a "$SUMMARY"
else
    say "SKIP nvidia-smi: not installed"
fi
if lsmod 2>/dev/null | grep -q '^nvidia_fs'; then
    say "nvidia-fs kernel module: loaded"
else
    say "nvidia-fs kernel module: not loaded (lsmod)"
fi

# ---- Python: the project from this checkout, and whatever it lacks from bench/wheels
export PYTHONPATH="$ROOT/src${PYTHONPATH:+:$PYTHONPATH}"
MODULES="kvikio numpy cryptography isal pytest pytest_benchmark xdist hypothesis torch"
missing=$(python3 -c "
import importlib.util, sys
print(' '.join(m for m in sys.argv[1:] if importlib.util.find_spec(m) is None))" $MODULES)
if [[ -n $missing ]]; then
    if compgen -G "$ROOT/bench/wheels/*.whl" >/dev/null; then
        say "installing from bench/wheels into $WORK/site (missing: $missing)"
        python3 -m pip install --quiet --no-index --no-deps --target "$WORK/site" "$ROOT"/bench/wheels/*.whl \
            >"$OUT/install.txt" 2>&1 || {
            say "pip failed ($(tail -1 "$OUT/install.txt")); unpacking the wheels instead"
            for wheel in "$ROOT"/bench/wheels/*.whl; do python3 -m zipfile -e "$wheel" "$WORK/site"; done
        }
        export PYTHONPATH="$WORK/site:$PYTHONPATH"
    else
        say "SKIP install: $missing missing and no wheels in bench/wheels (run bench/gpu_wheels.sh where there is internet)"
    fi
fi
python3 -c "import sys, torch; print(f'python {sys.version.split()[0]}, torch {torch.__version__}, CUDA', torch.version.cuda)" \
    2>&1 | tee -a "$SUMMARY"

cd "$ROOT" || exit 1
say ""
say "## GPU and GDS"
step status 60 python3 bench/gpu_check.py status
problem() { # the probe's reason why TRANSFER cannot run, empty if it can
    sed -n 's/^STATUS //p' "$OUT/status.txt" | python3 -c "
import json, sys
found = json.loads(sys.stdin.read() or '{}')
print((found.get('transfer_problems') or {}).get(sys.argv[1], 'the probe did not answer') or '')" "$1"
}
gpu_problem=$(problem cpu-gpu)
gds_problem=$(problem gpu-direct)

say ""
say "## Read sweep (gpu-direct, cpu-gpu, cpu-only; $FILE_BYTES files)"
if [[ -n $gpu_problem ]]; then
    say "SKIP gpu read sweep: $gpu_problem"
else
    mkdir -p "$WORK/target"
    before=$status
    step sweep 300 python3 -m pytest tests_qual/test_read_sweep.py -p no:cacheprovider -rfs --benchmark-disable \
        --transfer gpu-direct,cpu-gpu,cpu-only --sweep-file-bytes "$FILE_BYTES" --sweep-block-sizes 1M,128K,8K \
        --sweep-threads 16,4,1 --passes 1 --checkpoints-per-pass 1 --scale 0.00005 --target "$WORK/target" \
        --results "$OUT/sweep.json" --junitxml "$OUT/sweep.xml"
    grep -q '^ckptqual verdict' "$OUT/sweep.txt" && status=$before # any verdict is a result here, not a failure
    sed -n '/ckptqual read sweep/,/short test summary/p' "$OUT/sweep.txt" >>"$SUMMARY"
    python3 - "$OUT/sweep.json" "$gds_problem" <<'EOF' | tee -a "$SUMMARY"
import json, sys
path, gds_problem = sys.argv[1], sys.argv[2]
cells = [c for c in json.load(open(path)).get("sweep", {}).get("cells", []) if c["transfer"] == "gpu-direct"]
outcomes = sorted({c.get("outcome", "?") for c in cells})
print(f"gpu-direct cells: {', '.join(outcomes) or 'none'}; GDS: {gds_problem or 'available'}")
reasons = {c.get("invalid_reason") or c.get("reason") for c in cells} - {None}
for reason in sorted(reasons):
    print(f"  gpu-direct: {reason}")
if gds_problem and set(outcomes) & {"PASS", "MEASURED", "MARGINAL"}:
    print("ERROR: gpu-direct counted though GDS is unavailable")
    sys.exit(1)
EOF
    ((PIPESTATUS[0] != 0)) && status=1
fi

say ""
say "## Restore into GPU memory"
step restore 90 python3 bench/gpu_check.py restore --dir "$WORK"
say ""
say "## KvikIO reference (same kind of files, same directory)"
step reference 60 python3 bench/gpu_check.py reference --dir "$WORK" --file-bytes "$FILE_BYTES"
step kvikio-benchmark 60 python3 bench/gpu_check.py kvikio-benchmark --dir "$WORK" --file-bytes "$FILE_BYTES"

say ""
say "gpu check done in $SECONDS s; tables in $OUT"
exit $status
