#!/usr/bin/env bash
# The multi-GPU run (issue 8) on a machine with two or more H200s, in one call. Run from the
# repository root, with .whl carried (dask, distributed, dask-cuda: ../shared/device-wheels.sh):
#
#     OUT=/some/dir MULTIREDUCE_GIT_COMMIT=<sha> bash scripts/device_multigpu.sh [steps...]
#
# Steps (default: all, in this order): tests, profile, mpi, multigpu, scaling, dask.
# Everything goes under "$OUT"; summary_multigpu.txt lists each step with its exit status and
# seconds. NVLink multicast stays off (the machine's image sets NCCL_NVLS_ENABLE=0; nothing
# here uses NCCL or multicast).
set -uo pipefail
: "${OUT:?set OUT to the output directory}"
mkdir -p "$OUT"
cd "$(dirname "$0")/.."
# shellcheck source=scripts/_device_env.sh
source scripts/_device_env.sh
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
steps="${*:-tests profile mpi multigpu scaling dask}"
GPUS=$(nvidia-smi -L | wc -l)
RANKS=$(seq -s, 1 "$GPUS" | awk -F, '{s="1"; for (i = 2; i <= NF; i *= 2) s = s "," i; print s}')

SUMMARY="$OUT/summary_multigpu.txt"
: >"$SUMMARY"
# shellcheck source=scripts/_steps.sh
source scripts/_steps.sh  # the working directory is the repository root here

device_report "commit ${MULTIREDUCE_GIT_COMMIT:-unset}; GPUs $GPUS; rank counts $RANKS" >"$OUT/env_multigpu.txt" 2>&1

for s in $steps; do
  case $s in
    tests) step tests 200 "$PY" -m pytest -q -p no:cacheprovider --tb=short tests/test_mpi_gpu.py \
             "tests/test_dask.py::test_gpu_cupy_chunks_stats"
           step tests_partial_out 60 "$PY" -m pytest -q -p no:cacheprovider --tb=short -m gpu -k partial \
             tests/test_core.py ;;
    profile) for r in ${RANKS//,/ }; do
               step "profile_mpi_n$r" 90 "${MPIRUN[@]}" -n "$r" "$PY" scripts/profile_mpi.py --output "$OUT/profile_mpi_n$r.json"
             done ;;
    mpi) for r in ${RANKS//,/ }; do
           step "bench_mpi_n$r" 90 "${MPIRUN[@]}" -n "$r" "$PY" scripts/bench_mpi.py --output "$OUT/bench_mpi_n$r.json"
         done ;;
    multigpu) step bench_multigpu 400 "$PY" scripts/bench_multigpu.py --ranks "$RANKS" --per-device "$GPUS" --output "$OUT/multigpu.json" ;;
    scaling) step scaling_mpi 300 "$PY" scripts/bench_scaling.py --parts mpi,latency --ranks "$RANKS" --source synthetic \
               --latency-ranks 1,2,4,8,16 --output "$OUT/scaling_mpi.json" ;;
    dask) step scaling_dask 300 "$PY" scripts/bench_scaling.py --parts dask --workers "$RANKS" --output "$OUT/scaling_dask.json" ;;
    *) echo "unknown step $s" | tee -a "$SUMMARY"; exit 2 ;;
  esac
done
echo "done; outputs in $OUT" | tee -a "$SUMMARY"
