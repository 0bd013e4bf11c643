#!/usr/bin/env bash
# _with_mps.sh COMMAND...: run COMMAND while an NVIDIA MPS control daemon (default settings,
# pipe and log folders under /tmp) shares the GPU among processes; the daemon is stopped
# afterwards, also when COMMAND fails. Exit status: COMMAND's, or 3 if MPS could not start.
set -u
export CUDA_MPS_PIPE_DIRECTORY=/tmp/mr-mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mr-mps-log
mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
command -v nvidia-cuda-mps-control >/dev/null || { echo "nvidia-cuda-mps-control not found"; exit 3; }
nvidia-cuda-mps-control -d || { echo "MPS control daemon did not start"; exit 3; }
trap 'echo quit | nvidia-cuda-mps-control; sleep 1' EXIT
trap 'exit 143' TERM INT
"$@"
