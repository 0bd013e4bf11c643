#!/usr/bin/env bash
# The Dask layer and the host-to-GPU streaming path on the GPU machine (one H200, no dask in the
# image: the wheels come from .whl/, fetched here by ../shared/device-wheels.sh). Run from the
# repository root, with .whl carried:
#
#     OUT=/some/dir bash scripts/device_dask.sh
#
# Writes 7 files under "$OUT": summary.txt (each step, exit status, seconds), env.txt,
# pytest.txt (tests/test_dask.py and tests/test_stream.py, GPU tests included, -m "gpu or not
# gpu"), bench_dask.{txt,json} and bench_stream.{txt,json}. Steps are independent, each with a
# timeout; the whole script takes about 4-6 minutes (most of it kernel compilation, the 8 GiB
# streaming test and the 4x-device-memory generated reduction).
set -uo pipefail
: "${OUT:?set OUT to the output directory}"
mkdir -p "$OUT"
cd "$(dirname "$0")/.."
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  || { echo "wheel install failed" | tee "$OUT/summary.txt"; exit 1; }
export PYTHONPATH="/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
PY="${PYTHON:-python3}"

SUMMARY="$OUT/summary.txt"
: >"$SUMMARY"
# shellcheck source=scripts/_steps.sh
source scripts/_steps.sh  # the working directory is the repository root here

{
  git rev-parse HEAD 2>/dev/null || echo "git: no history here (MULTIREDUCE_GIT_COMMIT=${MULTIREDUCE_GIT_COMMIT:-unset})"
  nvidia-smi -L
  nproc
  free -g | head -2
  "$PY" -c 'import sys, numpy, cupy, dask, distributed; print(sys.version); print("numpy", numpy.__version__, "cupy", cupy.__version__, "dask", dask.__version__, "distributed", distributed.__version__)'
  "$PY" -c 'import dask_cuda; print("dask_cuda", dask_cuda.__version__)'
  "$PY" -c 'import cupy; a = cupy.cuda.runtime.pointerGetAttributes(cupy.cuda.alloc_pinned_memory(4096).ptr); print("PointerAttributes fields:", [f for f in dir(a) if not f.startswith("_")])'
} >"$OUT/env.txt" 2>&1

step pytest 330 "$PY" -m pytest -q -p no:cacheprovider -ra --durations=15 tests/test_dask.py tests/test_stream.py
step bench_dask 180 "$PY" scripts/bench_dask.py --cuda-cluster --output "$OUT/bench_dask.json"
step bench_stream 240 "$PY" scripts/bench_stream.py --output "$OUT/bench_stream.json"

echo "done; outputs in $OUT" | tee -a "$SUMMARY"
