# Sourced by scripts/device_multigpu.sh and scripts/device_overheads.sh, from the repository
# root, with OUT set: the GPU machine's Python (PY, absolute: mpirun's children may not share
# PATH), the carried Dask wheels installed once under /tmp/site, Open MPI's run-as-root and
# oversubscription settings, and MPIRUN (the launcher as an array).
PY="${PYTHON:-$(command -v python3)}"
[ -d /tmp/site/dask_cuda ] || "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl >"$OUT/wheels.txt" 2>&1 || echo "wheel install failed" >>"$OUT/wheels.txt"
export PYTHONPATH="/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export MULTIREDUCE_MPIEXEC="${MULTIREDUCE_MPIEXEC:-/usr/bin/mpirun}"
export MULTIREDUCE_MPIEXEC_ARGS="${MULTIREDUCE_MPIEXEC_ARGS-"--allow-run-as-root --oversubscribe"}"
read -ra MPIRUN <<<"$MULTIREDUCE_MPIEXEC $MULTIREDUCE_MPIEXEC_ARGS"

device_report() {  # device_report HEADER: the header line, GPUs and their topology, CPUs, library versions
  echo "$1"
  nvidia-smi -L
  nvidia-smi topo -m
  nvidia-smi --query-gpu=index,name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv
  nproc
  "$PY" -c 'import sys, numpy, cupy, mpi4py; print(sys.version); print("numpy", numpy.__version__, "cupy", cupy.__version__, "mpi4py", mpi4py.__version__)'
  "$PY" -c 'import dask, distributed, dask_cuda; print("dask", dask.__version__, "distributed", distributed.__version__, "dask_cuda", dask_cuda.__version__)'
}
