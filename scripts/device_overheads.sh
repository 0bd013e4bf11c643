#!/usr/bin/env bash
# The per-call overhead targets on the one-H200 machine, in one call: host-to-GPU streaming
# (issue 4), Dask on one GPU (issue 4), the MPI layer (issue 3) and Python overhead of a tiny
# reduction (issue 2). Run from the repository root, with .whl carried (dask, distributed,
# dask-cuda: ../shared/device-wheels.sh):
#
#     OUT=/some/dir MULTIREDUCE_GIT_COMMIT=<sha> bash scripts/device_overheads.sh [steps...]
#
# Steps (default: all, in this order): tests, stream, generated, dask, mpi, kernel, axis, mps. Each step's
# output goes to "$OUT/<name>.txt" (and JSON where the script writes one); summary.txt gets
# one line per step (exit status, seconds, command) and is appended to, so that the script can
# be called once per step. About 9 minutes for all steps.
#
# The "mps" step runs bench_mpi at 4 ranks under CUDA MPS (started here in its default
# configuration with pipe and log folders under /tmp, and stopped at the end of the step):
# without it, 4 processes on one GPU take turns on it (time slices), and that, not the MPI
# layer, is what a 4-rank time on one GPU would measure.
set -uo pipefail
: "${OUT:?set OUT to the output directory}"
mkdir -p "$OUT"
cd "$(dirname "$0")/.."
# shellcheck source=scripts/_device_env.sh
source scripts/_device_env.sh
steps="${*:-tests stream generated dask mpi kernel axis mps}"

SUMMARY="$OUT/summary.txt"
# shellcheck source=scripts/_steps.sh
source scripts/_steps.sh  # the working directory is the repository root here

[ -s "$OUT/env.txt" ] || device_report "commit ${MULTIREDUCE_GIT_COMMIT:-unset}" >"$OUT/env.txt" 2>&1

for s in $steps; do
  case $s in
    tests) step tests_stream_dask 200 "$PY" -m pytest -q -p no:cacheprovider --tb=short -ra tests/test_stream.py tests/test_dask.py
           step tests_mpi_gpu 150 "$PY" -m pytest -q -p no:cacheprovider --tb=short tests/test_mpi_gpu.py ;;
    stream) step diag_stream 150 "$PY" scripts/diag_stream.py
            step bench_stream 200 "$PY" scripts/bench_stream.py --cases pinned,pageable,seed,dask --gib 4 --repeat 5 \
              --output "$OUT/bench_stream.json" ;;
    generated) step bench_stream_generated 300 "$PY" scripts/bench_stream.py --cases generated \
                 --output "$OUT/bench_stream_generated.json" ;;
    dask) step bench_dask 150 "$PY" scripts/bench_dask.py --output "$OUT/bench_dask.json"
          step diag_dask 150 "$PY" scripts/diag_dask.py --profile ;;
    mpi) step profile_mpi_n1 90 "${MPIRUN[@]}" -n 1 "$PY" scripts/profile_mpi.py --output "$OUT/profile_mpi_n1.json"
         for r in 1 2 4; do
           step "bench_mpi_n$r" 90 "${MPIRUN[@]}" -n "$r" "$PY" scripts/bench_mpi.py --output "$OUT/bench_mpi_n$r.json"
         done
         step bench_mpi_cpu_n4 90 "${MPIRUN[@]}" -n 4 "$PY" scripts/bench_mpi.py --cpu --output "$OUT/bench_mpi_cpu_n4.json" ;;
    axis) step bench_axis 150 "$PY" scripts/bench_axis.py --skip-repro --repeat 10 --out "$OUT/bench_axis.json" ;;
    kernel) step bench_kernel 200 "$PY" scripts/bench_kernel.py --sizes 10,20,24,30 --dtypes float32 --repeat 15 \
              --budget 0.5 --out "$OUT/bench_kernel.json" ;;
    mps) step bench_mpi_mps_n4 120 bash scripts/_with_mps.sh "${MPIRUN[@]}" -n 4 "$PY" scripts/bench_mpi.py --output "$OUT/bench_mpi_mps_n4.json" ;;
    *) echo "unknown step $s" | tee -a "$SUMMARY"; exit 2 ;;
  esac
done
echo "done: $steps" | tee -a "$SUMMARY"
