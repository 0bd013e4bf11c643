#!/usr/bin/env bash
# The MPI layer on the GPU machine: one H200 shared by all ranks, Open MPI 4.1.6 at
# /usr/bin/mpirun (not CUDA-aware), mpi4py, CuPy. Run from the repository root:
#
#     OUT=/some/dir bash scripts/device_mpi.sh
#
# Everything goes under "$OUT"; summary.txt lists each step with its exit status and seconds.
# Steps are independent (one failing does not stop the others) and each has a timeout; the
# whole script takes about 2-3 minutes, most of it the first compilation of the kernels.
set -uo pipefail
: "${OUT:?set OUT to the output directory}"
mkdir -p "$OUT"
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
# An absolute path: mpirun starts ranks with a PATH that may find another python3.
PY="${PYTHON:-$(command -v python3)}"

# Open MPI as root, more ranks than it counts slots for, and no CMA single-copy in containers
# that forbid ptrace. The tests' launcher reads MULTIREDUCE_MPIEXEC_ARGS.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_btl_vader_single_copy_mechanism=none
export MULTIREDUCE_MPIEXEC_ARGS="${MULTIREDUCE_MPIEXEC_ARGS-"--allow-run-as-root --oversubscribe"}"
unset MULTIREDUCE_CUDA_AWARE MULTIREDUCE_DEVICE
# MPIRUN_CMD overrides the launcher (e.g. to dry-run this script elsewhere).
read -ra MPIRUN <<<"${MPIRUN_CMD:-/usr/bin/mpirun --allow-run-as-root --oversubscribe}"

SUMMARY="$OUT/summary.txt"
: >"$SUMMARY"
# shellcheck source=scripts/_steps.sh
source scripts/_steps.sh  # the working directory is the repository root here

# --- environment and the two CUDA-aware sources, asked directly --------------------------------
{
  git rev-parse HEAD
  git status --short
  nvidia-smi -L
  "${MPIRUN[0]}" --version | head -1
  "$PY" -c 'import sys, numpy, mpi4py, cupy; print(sys.version); print("numpy", numpy.__version__, "mpi4py", mpi4py.__version__, "cupy", cupy.__version__)'
  ompi_info --parsable --all 2>/dev/null | grep -E 'mpi_built_with_cuda_support|mpiext' || echo "ompi_info: no cuda lines"
} >"$OUT/env.txt" 2>&1
# Both probes, even though the library asks only until the first answers: this shows what the
# MPI_T reading of mpi_built_with_cuda_support says on a real Open MPI (compare ompi_info above).
step cuda_aware_probes 60 "$PY" -c '
from multireduce import mpi
from multireduce._transport import mpix_probe, openmpi_cvar_probe
lib = mpi._mpi_library()
print("library:", mpi.MPI.Get_library_version().splitlines()[0])
print("MPIX_Query_cuda_support:", mpix_probe(lib)())
print("Open MPI cvar:", openmpi_cvar_probe(lib, mpi.MPI.Get_library_version())())
print("decision:", mpi.cuda_aware())'

# --- the main job, 1, 2 and 4 ranks on the one GPU ---------------------------------------------
step info_n4 60 "${MPIRUN[@]}" -n 4 "$PY" -m multireduce info
for n in 1 2 4; do
  step "run_n$n" 180 "${MPIRUN[@]}" -n "$n" "$PY" -m multireduce
  step "run_n${n}_json" 120 "${MPIRUN[@]}" -n "$n" "$PY" -m multireduce --json --all-ranks
done
step run_cpu_n4 120 "${MPIRUN[@]}" -n 4 "$PY" -m multireduce --cpu
step run_float64_uneven_n4 120 "${MPIRUN[@]}" -n 4 "$PY" -m multireduce --dtype float64 --n 100000007
# A file: each rank reads its slice (load), copies it to its GPU (h2d), reduces, checks.
TMPD=$(mktemp -d)
"$PY" -c "import numpy as np; np.save('$TMPD/x.npy', np.random.default_rng(0).standard_normal(2**26).astype(np.float32))"
step run_input_npy_n4 180 "${MPIRUN[@]}" -n 4 "$PY" -m multireduce --input "$TMPD/x.npy" --check
# One rank's file is missing: the job must end at once, non-zero, the error printed once.
"$PY" -c "import numpy as np; [np.save('$TMPD/part_%d.npy' % r, np.ones(10)) for r in (0, 1, 3)]"
step fault_missing_rank2_n4 60 "${MPIRUN[@]}" -n 4 "$PY" -m multireduce --input "$TMPD/part_{rank}.npy"
rm -rf "$TMPD"

# --- tests: GPU MPI tests, and the CPU MPI/CLI tests under Open MPI -----------------------------
step pytest_mpi_gpu 240 "$PY" -m pytest -q -p no:cacheprovider tests/test_mpi_gpu.py -ra
step pytest_mpi_cpu_openmpi 240 "$PY" -m pytest -q -p no:cacheprovider tests/test_mpi.py tests/test_mpi_local.py tests/test_cli.py -ra

# --- what the MPI layer adds per call (scalar partials), and the CLI sweep ---------------------
for n in 1 2 4; do
  step "bench_mpi_n$n" 120 "${MPIRUN[@]}" -n "$n" "$PY" scripts/bench_mpi.py --output "$OUT/bench_mpi_n$n.json"
done
step bench_mpi_cpu_n4 120 "${MPIRUN[@]}" -n 4 "$PY" scripts/bench_mpi.py --cpu --output "$OUT/bench_mpi_cpu_n4.json"
step cli_bench_n4 180 "${MPIRUN[@]}" -n 4 "$PY" -m multireduce bench --output "$OUT/cli_bench_n4.json"

echo "done; outputs in $OUT" | tee -a "$SUMMARY"
