#!/usr/bin/env bash
# The core engine on the GPU machine, in one call: the GPU tests, the nvcc build test, and the
# kernel benchmark (or a subset of it). Run from the repository root:
#
#     OUT=/some/dir bash scripts/device_core.sh [tests] [tune] [bench] [quick] [axis] [seed] \
#         [stats] [repro] [profile] [mpi]
#
# Set MULTIREDUCE_GIT_COMMIT to the commit (the machine's copy has no git history). The
# default, "tests quick axis stats", fits one 10-minute call.
#
# Everything goes under "$OUT"; summary.txt lists each step with its exit status and seconds.
set -uo pipefail
: "${OUT:?set OUT to the output directory}"
mkdir -p "$OUT"
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
PY="${PYTHON:-$(command -v python3)}"  # absolute: mpirun's children may not share PATH
steps="${*:-tests quick axis stats}"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export MULTIREDUCE_MPIEXEC_ARGS="${MULTIREDUCE_MPIEXEC_ARGS-"--allow-run-as-root --oversubscribe"}"
read -ra MPIRUN <<<"${MPIRUN_CMD:-/usr/bin/mpirun --allow-run-as-root --oversubscribe}"

SUMMARY="$OUT/summary_core.txt"
: >"$SUMMARY"
# shellcheck source=scripts/_steps.sh
source scripts/_steps.sh  # the working directory is the repository root here

{
  git rev-parse HEAD
  git status --short
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,utilization.gpu --format=csv
  "$PY" -c 'import sys, numpy, cupy; print(sys.version); print("numpy", numpy.__version__, "cupy", cupy.__version__)'
  nvcc --version | tail -1
} >"$OUT/env_core.txt" 2>&1

for s in $steps; do
  case $s in
    tests) step gpu_tests 300 "$PY" -m pytest -q -p no:cacheprovider --tb=short --maxfail=30 \
             tests/test_gpu.py tests/test_gpu_axis.py tests/test_gpu_stats.py tests/test_reproducible.py \
             tests/test_mpi_gpu.py
           step gpu_tests_core_semantics 120 "$PY" -m pytest -q -p no:cacheprovider --tb=short -m gpu \
             tests/test_core.py tests/test_semantics.py ;;
    axis) step bench_axis 150 "$PY" scripts/bench_axis.py --repeat 8 --out "$OUT/bench_axis.json" ;;
    stats) step bench_stats 60 "$PY" scripts/bench_stats.py --repeat 6 --out "$OUT/bench_stats.json" ;;
    repro) step device_rounding 60 "$PY" -m pytest -q -p no:cacheprovider tests/test_reproducible.py -k device_rounding
           step bench_repro 60 "$PY" scripts/bench_axis.py --skip-axis --repeat 6 --out "$OUT/bench_repro.json" ;;
    profile) step profile 40 "$PY" scripts/profile_overhead.py ;;
    mpi) step bench_mpi_n1 40 "${MPIRUN[@]}" -n 1 "$PY" scripts/bench_mpi.py --output "$OUT/bench_mpi_n1.json" ;;
    seed) step seed_table 300 "$PY" scripts/bench_seed_table.py --out "$OUT/seed_table.json" ;;
    tune) step tune 240 "$PY" scripts/bench_kernel.py --sizes 20,24,30 --dtypes float32,float64 --ops sum,max \
             --variants 256x4,256x8,512x8,1024x4,1024x2 --repeat 15 --out "$OUT/tune.json" ;;
    quick) step bench_quick 240 "$PY" scripts/bench_kernel.py --quick --out "$OUT/bench_quick.json" ;;
    bench) step bench 480 "$PY" scripts/bench_kernel.py --out "$OUT/bench_kernel.json" ;;
    *) echo "unknown step $s" | tee -a "$SUMMARY"; exit 2 ;;
  esac
done
