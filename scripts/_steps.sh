# Sourced by scripts/device_*.sh: run named steps with a timeout, each step's output in
# "$OUT/NAME.txt", and one line per step (exit status, seconds, command) in "$SUMMARY".

step() {  # step NAME TIMEOUT_S COMMAND...
  local name=$1 limit=$2
  shift 2
  local start=$SECONDS rc
  timeout --kill-after=10 "$limit" "$@" >"$OUT/$name.txt" 2>&1
  rc=$?
  printf '%-28s rc=%-4s %4ss  %s\n' "$name" "$rc" "$((SECONDS - start))" "$*" | tee -a "$SUMMARY"
}
