#!/usr/bin/env bash
export MULTIREDUCE_GIT_COMMIT=$(cat .sha)
export OUT=/tmp/res
mkdir -p $OUT
pack() { tar czf "$OUT_REAL/res.tgz" -C /tmp res; }
bash scripts/device_overheads.sh stream generated; pack
source scripts/_device_env.sh
SUMMARY=$OUT/summary.txt; source scripts/_steps.sh
step profile_mpi_mps_n4 120 bash scripts/_with_mps.sh "${MPIRUN[@]}" -n 4 "$PY" scripts/profile_mpi.py --output "$OUT/profile_mpi_mps_n4.json"; pack
step tests_stream_dask 200 "$PY" -m pytest -q -p no:cacheprovider --tb=short -ra tests/test_stream.py tests/test_dask.py; pack
