#!/usr/bin/env bash
# Issue 24's GPU measurement in ONE call of a borrowed GPU machine (an H100 or H200, no network):
# installs the carried wheels (.whl/, made here by benchmarks/gpu_wheels.sh), builds the C extensions
# in place, records the machine and versions, checks that steady training steps do not synchronise
# (benchmarks/sync_debug_check.py), runs the three benchmarks on CUDA (bench_boost.py at batch 4,096
# and 16,384 with the `ceiling` reference, bench_embeddings.py, bench_dynamic.py, bench_lru.py), profiles steady
# steps (benchmarks/profile_step.py, into boost.log) and then every
# CUDA test of the suite (benchmarks/cuda_tests.py selects them). Each step runs under its own
# `timeout`, clamped to what is left of the whole script's budget (GPU_CHECK_BUDGET, 465 s), so the
# script ends within 8 minutes whatever hangs. Everything lands in $OUT (./gpu-out when unset), in
# 8 files: summary.md, env.txt, sync_debug.log, boost.log, boost.json, embeddings.log, dynamic.log,
# cuda_tests.log (benchmarks/README_GPU.md says what each holds and how to call the device).
#
#     bash benchmarks/gpu_check.sh             # on the GPU machine, from the repository root
#     bash benchmarks/gpu_check.sh --dry-run   # anywhere: tiny sizes on the CPU, tests only collected
#
# Without CUDA (or with --dry-run) every step still runs, on the CPU at tiny sizes (nothing there is a
# measurement), the CUDA tests are only collected, and the wheels only listed. The exit status is 0
# when every step exited 0, else 1 (summary.md lists each step's status).
set -uo pipefail
DRY=0
case "${1:-}" in
    --dry-run) DRY=1 ;;
    "") ;;
    *) echo "gpu_check.sh: unknown argument '$1' (allowed: --dry-run)" >&2; exit 2 ;;
esac
cd "$(dirname "$0")/.."
ROOT=$PWD
PY=${PYTHON:-python3}
OUT=${OUT:-./gpu-out}
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd)
BUDGET=${GPU_CHECK_BUDGET:-465}
START=$(date +%s)
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
export PYTHONUNBUFFERED=1 PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
SUMMARY=$OUT/summary.md
for f in summary.md env.txt sync_debug.log boost.log boost.json embeddings.log dynamic.log cuda_tests.log; do
    : >"$OUT/$f"  # a rerun into the same folder starts them afresh (the steps append)
done
FAILED=0
ROWS=()

# step NAME BUDGET_S LOG COMMAND...: runs COMMAND under timeout (its budget, or what is left of the
# whole script's, if less), appending its output to $OUT/LOG; records a row for summary.md.
step() {
    local name=$1 budget=$2 log=$OUT/$3 rc began took left
    shift 3
    left=$((START + BUDGET - $(date +%s)))
    [ "$budget" -gt "$left" ] && budget=$left
    if [ "$budget" -lt 10 ]; then
        ROWS+=("| $name | not run: the script's budget (${BUDGET} s) is spent | 0 | - | $(basename "$log") |")
        FAILED=1
        return 1
    fi
    printf '\n===== %s (timeout %s s): %s\n' "$name" "$budget" "$*" >>"$log"
    began=$(date +%s)
    timeout -k 5 $((budget - 5)) "$@" >>"$log" 2>&1
    rc=$?
    took=$(($(date +%s) - began))
    local status="exit $rc"
    [ $rc -eq 124 ] || [ $rc -eq 137 ] && status="TIMED OUT (exit $rc)"
    [ $rc -ne 0 ] && FAILED=1
    printf '===== %s: %s after %s s\n' "$name" "$status" "$took" >>"$log"
    ROWS+=("| $name | $status | $took | $budget | $(basename "$log") |")
    return $rc
}

# --- wheels, build, versions ------------------------------------------------------------------
if [ -d .whl ] && ls .whl/*.whl >/dev/null 2>&1; then
    if [ $DRY -eq 1 ]; then
        step wheels 20 env.txt ls -l .whl
    elif step wheels 20 env.txt "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
            --upgrade --target "$TMP/site" .whl/*.whl; then
        export PYTHONPATH="$TMP/site:$PYTHONPATH"
    fi
else
    ROWS+=("| wheels | none carried (.whl/ absent): run benchmarks/gpu_wheels.sh here first | 0 | - | env.txt |")
fi
step build_ext 30 env.txt "$PY" setup.py -q build_ext --inplace
step versions 20 env.txt bash -c "date -u; uname -a; nproc; free -g | head -2
    nvidia-smi || echo 'nvidia-smi: not available'
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv 2>/dev/null
    nvcc --version 2>/dev/null | tail -2
    git rev-parse HEAD 2>/dev/null || echo 'git: no repository here'
    $PY -m pip list 2>/dev/null | grep -i -E '^(torch|triton|numpy|pytest|pytest-timeout|pydantic) '
    $PY -c 'import sys, torch, recstream
print(\"python\", sys.version.split()[0], \"torch\", torch.__version__, \"cuda\", torch.version.cuda,
      \"cudnn\", torch.backends.cudnn.version(), \"recstream\", recstream.__file__)
print(\"cuda available:\", torch.cuda.is_available())
if torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    print(\"device:\", p.name, \"capability\", torch.cuda.get_device_capability(0), round(p.total_memory / 2**30, 1), \"GiB\")
from recstream.nn import native as nn_native
from recstream.optim import native as optim_native
print(\"compiled CPU kernels: hash\", nn_native.AVAILABLE, \"rows\", optim_native.AVAILABLE)'"

if [ $DRY -eq 0 ] && "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
    DEVICE=cuda
else
    DEVICE=cpu
    echo "gpu_check.sh: $([ $DRY -eq 1 ] && echo '--dry-run' || echo 'no CUDA here'): CPU at tiny sizes, tests only collected" \
        | tee -a "$OUT/env.txt"
fi

# --- the checks and the measurements -----------------------------------------------------------
BOOST_VARIANTS=(hand hand_tuned ceiling O1 O2 widedeep widedeep_eager widedeep_O2 deepfm deepfm_eager dense_only)
if [ $DEVICE = cuda ]; then
    SYNC_ARGS=(--device cuda)
    BOOST_ARGS=(--device cuda --test-rows 200000 --reps 3 --threads 4)
    BOOST_4096=(--batch-size 4096 --rows 1048576 --time-budget 80)
    BOOST_16384=(--batch-size 16384 --rows 2097152 --time-budget 65)
    EMB_ARGS=(--device cuda --threads 4 --reps 20)
    DYN_ARGS=(--device cuda --step model)
    LRU_ARGS=(--device cuda --reps 5)
else  # wiring only: nothing here is a measurement
    SYNC_ARGS=(--device cpu --steps 3 --warm 2 --batch-size 64 --vocab 100 --hidden 16)
    BOOST_ARGS=(--device cpu --test-rows 2000 --reps 1 --threads 1 --vocab 500 --hidden 16)
    BOOST_4096=(--batch-size 256 --rows 1024 --time-budget 80)
    BOOST_16384=(--batch-size 512 --rows 2048 --time-budget 65)
    EMB_ARGS=(--device cpu --threads 1 --reps 2 --warmup 1 --batch 64 --vocab 1000 --full-vocab 10000
              --full-history 5 --num-batches 2)
    DYN_ARGS=(--device cpu --rows 1000 --batch-size 64 --rounds 1 --steps 2 --warmup 1)
    LRU_ARGS=(--device cpu --rows 20000 --k 1000 --reps 1)
fi
step sync_debug 45 sync_debug.log "$PY" benchmarks/sync_debug_check.py "${SYNC_ARGS[@]}"
step boost_4096 95 boost.log "$PY" benchmarks/bench_boost.py "${BOOST_ARGS[@]}" "${BOOST_4096[@]}" \
    --variants "${BOOST_VARIANTS[@]}" --out "$TMP/boost_4096.json"
step boost_16384 80 boost.log "$PY" benchmarks/bench_boost.py "${BOOST_ARGS[@]}" "${BOOST_16384[@]}" \
    --variants "${BOOST_VARIANTS[@]}" --out "$TMP/boost_16384.json"
"$PY" - "$TMP" "$OUT/boost.json" <<'EOF'
import json, sys
from pathlib import Path
runs = {p.stem.split("_")[1]: json.loads(p.read_text()) for p in sorted(Path(sys.argv[1]).glob("boost_*.json"))}
Path(sys.argv[2]).write_text(json.dumps(runs, indent=1))
EOF
if [ $DEVICE = cuda ]; then
    PROFILE_ARGS=(--device cuda --variants widedeep widedeep_eager deepfm O1)
else
    PROFILE_ARGS=(--device cpu --batch-size 64 --vocab 100 --hidden 16 --steps 2 --warm 2 --variants widedeep O1)
fi
step profile 45 boost.log "$PY" benchmarks/profile_step.py "${PROFILE_ARGS[@]}"
step embeddings 60 embeddings.log "$PY" benchmarks/bench_embeddings.py "${EMB_ARGS[@]}"
step dynamic 40 dynamic.log "$PY" benchmarks/bench_dynamic.py "${DYN_ARGS[@]}"
step lru 20 embeddings.log "$PY" benchmarks/bench_lru.py "${LRU_ARGS[@]}"

# The CUDA tests: files that mention CUDA at all, narrowed by the plugin to the tests that do.
mapfile -t TEST_FILES < <(grep -rlis --include='test_*.py' cuda tests | sort)
TEST_ARGS=(-p cuda_tests -p no:cacheprovider -o addopts= -v -rfEs)
[ $DEVICE = cpu ] && TEST_ARGS+=(--collect-only -q)
"$PY" -c 'import pytest_timeout' 2>/dev/null && TEST_ARGS+=(--timeout 90)
PYTHONPATH="$ROOT/benchmarks:$PYTHONPATH" step cuda_tests 150 cuda_tests.log \
    "$PY" -m pytest "${TEST_ARGS[@]}" "${TEST_FILES[@]}"

# --- summary.md ------------------------------------------------------------------------------------
{
    echo "# gpu_check.sh on $(hostname), $(date -u '+%Y-%m-%d %H:%M UTC'), device $DEVICE$([ $DRY -eq 1 ] && echo ' (--dry-run)')"
    echo
    grep -m1 '^device:' "$OUT/env.txt" || true
    grep -m1 '^python ' "$OUT/env.txt" || true
    echo
    echo "| step | status | seconds | timeout s | log |"
    echo "| --- | --- | --- | --- | --- |"
    printf '%s\n' "${ROWS[@]}"
    echo "| total | | $(($(date +%s) - START)) | $BUDGET | |"
    echo
    echo "## sync debug (sync_debug.log)"
    grep -E '^\||cases pass' "$OUT/sync_debug.log" || echo "(no table: see sync_debug.log)"
    echo
    echo "## bench_boost (boost.log; ratios to ceiling from the same run)"
    grep -E '^rows/epoch|^\||ceiling: |cuda_graphs: |time-budget' "$OUT/boost.log" || echo "(no table: see boost.log)"
    echo
    echo "## profile_step (boost.log: per steady step, and the ops with the most CPU time)"
    grep -E '^## ' "$OUT/boost.log" || echo "(no profile: see boost.log)"
    echo
    echo "## bench_embeddings (embeddings.log)"
    grep -E '^(batch=|variant|dense_adam|fused_|hash_|speedup)' "$OUT/embeddings.log" || echo "(see embeddings.log)"
    echo
    echo "## bench_lru (embeddings.log: one LRU pass's select)"
    grep -E '^(rows=|\| [0-9])' "$OUT/embeddings.log" || echo "(see embeddings.log)"
    echo
    echo "## bench_dynamic (dynamic.log)"
    grep -E '^(rows=|model|widedeep|deepfm|dcnv2|dlrm)' "$OUT/dynamic.log" || echo "(see dynamic.log)"
    echo
    echo "## CUDA tests (cuda_tests.log)"
    grep -E '(passed|failed|skipped|error|collected|selected).* in [0-9.]+s' "$OUT/cuda_tests.log" | tail -1 \
        || echo "(no pytest summary line: see cuda_tests.log)"
    grep -E '^(FAILED|ERROR) ' "$OUT/cuda_tests.log" || true
} >"$SUMMARY"
cat "$SUMMARY"
count=$(find "$OUT" -type f | wc -l)
[ "$count" -le 8 ] || echo "gpu_check.sh: $count files in $OUT, more than the 8 a device call brings back" >&2
exit $FAILED
