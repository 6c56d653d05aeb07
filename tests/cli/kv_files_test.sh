#!/usr/bin/env bash
# No KV file outlives a run of `strata run --kv disk`, however the run ends: a real child
# process is killed by SIGINT, SIGTERM, SIGHUP, SIGKILL or SIGXFSZ at random points of its
# prefill and decode, and the KV directory must hold nothing afterwards. Where the store
# cannot be unnamed (forced here as on filesystems without O_TMPFILE), a killed run's named
# file is removed by the next run, which says so. Runs in separate PID namespaces (where
# unshare is allowed) share a KV directory without colliding.
#
# Usage: kv_files_test.sh PATH/TO/strata REAL_MODEL.gguf [RUNS]   (RUNS: kills, default 10;
# the soak in docs/experiments/hardening.md used 200)
set -u
strata="$1"
model="$2"
runs="${3:-10}"
src=$(cd "$(dirname "$0")/../.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
kv="$tmp/kv"
mkdir -p "$kv"
fails=0
fail() {
  echo "FAIL $*"
  fails=$((fails + 1))
}

# Quick adapters (the file's quality does not matter here) and a config that names them.
"$strata" calibrate -m "$model" --text "$src/tuner/data/calibration.txt" --tokens 256 \
  --window 256 --ratios 4 -o "$tmp/kv.adapters" -t 2 >/dev/null 2>&1 ||
  { echo "FAIL calibrate"; exit 1; }
printf 'kv:\n  policy: disk\n  adapters: %s\n  dir: %s\n' "$tmp/kv.adapters" "$kv" >"$tmp/cfg.yaml"
# A prompt long enough that prefill takes a good part of a second.
for i in $(seq 60); do
  echo "The printing press changed how knowledge moved from town to town, year $i."
done >"$tmp/prompt.txt"

left() { ls -A "$kv"; }

# run_killed SIGNAL DELAY [env...]: starts a generation and sends SIGNAL after DELAY seconds.
run_killed() {
  local sig="$1" delay="$2"
  shift 2
  env "$@" "$strata" run -m "$model" --config "$tmp/cfg.yaml" -f "$tmp/prompt.txt" -n 400 \
    --ignore-eos -t 2 >/dev/null 2>"$tmp/err" &
  local pid=$!
  sleep "$delay"
  kill "-$sig" "$pid" 2>/dev/null
  wait "$pid" 2>/dev/null
}

signals=(INT TERM HUP KILL XFSZ)
for ((i = 0; i < runs; i++)); do
  sig=${signals[$((RANDOM % ${#signals[@]}))]}
  delay=$(printf '0.%03d' $((RANDOM % 1000)))
  [ $((RANDOM % 2)) -eq 0 ] && delay=$(awk -v d="$delay" 'BEGIN { print d + 1.2 }')
  run_killed "$sig" "$delay"
  [ -z "$(left)" ] || fail "SIG$sig after ${delay}s left: $(left)"
done
echo "ok   $runs runs killed at random points left no KV file"

# A file-size limit ends the run with SIGXFSZ while it creates its store.
(
  ulimit -f 64
  "$strata" run -m "$model" --config "$tmp/cfg.yaml" -p hi -n 4 >/dev/null 2>&1
)
[ -z "$(left)" ] && echo "ok   a run ended by its file-size limit left nothing" ||
  fail "file-size limit left: $(left)"

# Named stores: a SIGKILLed run leaves its file; the next run removes it and says so.
run_killed KILL 1.0 STRATA_STORAGE_FORCE_FALLBACK=tmpfile
stale=$(left)
if [ -z "$stale" ]; then
  fail "a killed run with a named store left no file to recover from"
else
  # Its io_uring may hold the file a moment after the process died.
  sleep 1
  STRATA_STORAGE_FORCE_FALLBACK=tmpfile "$strata" run -m "$model" --config "$tmp/cfg.yaml" \
    -p hi -n 2 >/dev/null 2>"$tmp/err2"
  if [ -n "$(left)" ]; then
    fail "the next run did not remove $stale: $(left)"
  elif ! grep -q "removed .*$stale" "$tmp/err2"; then
    fail "the next run removed $stale without saying so: $(cat "$tmp/err2")"
  else
    echo "ok   $(grep -o 'removed .*' "$tmp/err2" | head -1 | cut -c1-160)"
  fi
fi

# Two runs in their own PID namespaces (each its namespace's PID 1) share the directory.
if unshare --pid --fork --map-root-user true 2>/dev/null; then
  for n in 1 2; do
    STRATA_STORAGE_FORCE_FALLBACK=tmpfile unshare --pid --fork --map-root-user \
      "$strata" run -m "$model" --config "$tmp/cfg.yaml" -p "run $n" -n 4 >/dev/null \
      2>"$tmp/ns$n" &
  done
  wait
  if grep -qi "exists\|error" "$tmp/ns1" "$tmp/ns2"; then
    fail "runs in two PID namespaces collided: $(cat "$tmp/ns1" "$tmp/ns2")"
  else
    echo "ok   two runs in separate PID namespaces shared the KV directory"
  fi
  [ -z "$(left)" ] || fail "PID-namespace runs left: $(left)"
else
  echo "skip PID namespaces: unshare is not allowed here (names carry no PID; see the storage tests)"
fi

[ $fails -eq 0 ] && echo "all KV file checks passed"
exit $fails
