#!/usr/bin/env bash
export MULTIREDUCE_GIT_COMMIT=$(cat .sha)
export OUT=/tmp/res
mkdir -p $OUT
pack() { tar czf "$OUT_REAL/res.tgz" -C /tmp res; }
for s in tests stream generated mpi mps; do
  bash scripts/device_overheads.sh $s
  pack
done
