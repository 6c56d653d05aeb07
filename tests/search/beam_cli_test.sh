#!/usr/bin/env bash
# `strata run --beams`: ranked beams on stdout, the search's counters in --stats JSON, and
# clear errors (non-zero exit, never a crash or hang) for bad beam parameters.
# Usage: beam_cli_test.sh PATH/TO/strata REAL_MODEL.gguf
set -u
strata="$1"
model="$2"
fails=0
run=("$strata" run -m "$model" -t 1 -p "Three tips for a good night's sleep:" --seed 5)

out=$(timeout 300 "${run[@]}" --beams 4 --beam-width 2 --step-tokens 8 -n 16 --stats \
  --beam-budget 2M 2>"${TMPDIR:-/tmp}/beam_cli_stats.$$")
rc=$?
stats=$(cat "${TMPDIR:-/tmp}/beam_cli_stats.$$"); rm -f "${TMPDIR:-/tmp}/beam_cli_stats.$$"
if [ $rc -ne 0 ]; then
  echo "FAIL search: exit $rc"; echo "$stats" | tail -3; fails=$((fails + 1))
else
  n=$(grep -c '^--- beam [0-9]* of 4: score ' <<<"$out")
  [ "$n" -eq 4 ] && echo "ok   four ranked beams" || { echo "FAIL: $n beams printed"; fails=$((fails + 1)); }
  for key in '"bytes_moved"' '"blocks_shared_peak"' '"rounds"' '"stall_seconds"' '"peak_fast_bytes"'; do
    grep -qF "$key" <<<"$stats" && echo "ok   --stats has $key" ||
      { echo "FAIL: --stats lacks $key"; fails=$((fails + 1)); }
  done
  peak=$(grep -o '"peak_fast_bytes": [0-9]*' <<<"$stats" | grep -o '[0-9]*$')
  [ "$peak" -le 2097152 ] && echo "ok   peak fast bytes $peak within 2 MiB" ||
    { echo "FAIL: peak fast bytes $peak over the budget"; fails=$((fails + 1)); }
  # The baseline schedule returns the same ranked beams.
  base=$(timeout 300 "${run[@]}" --beams 4 --beam-width 2 --step-tokens 8 -n 16 \
    --beam-schedule tokenwise 2>/dev/null)
  [ "$base" == "$out" ] && echo "ok   tokenwise baseline prints the same beams" ||
    { echo "FAIL: tokenwise baseline differs"; fails=$((fails + 1)); }
  # A scorer model (the same file) sharing a 6 MiB budget, split by the cost model.
  sfile="${TMPDIR:-/tmp}/beam_cli_shared.$$"
  timeout 300 "${run[@]}" --beams 4 --beam-width 2 --step-tokens 8 -n 16 --stats \
    --scorer-model "$model" --beam-budget 6M >/dev/null 2>"$sfile"
  rc=$?
  shared=$(cat "$sfile"); rm -f "$sfile"
  both=$(grep -o '"peak_fast_bytes_both": [0-9]*' <<<"$shared" | grep -o '[0-9]*$')
  if [ $rc -ne 0 ] || [ -z "$both" ]; then
    echo "FAIL shared budget: exit $rc"; echo "$shared" | tail -3; fails=$((fails + 1))
  elif [ "$both" -le 6291456 ] && grep -qF '"verifier_phase_share"' <<<"$shared"; then
    echo "ok   scorer and generator share 6 MiB (peak $both)"
  else
    echo "FAIL: shared peak $both over 6 MiB or no shares reported"; fails=$((fails + 1))
  fi
fi

expect() {
  local name="$1" want="$2"
  shift 2
  local o r
  o=$(timeout 120 "${run[@]}" "$@" 2>&1 </dev/null)
  r=$?
  if [ $r -eq 0 ] || [ $r -ge 124 ]; then
    echo "FAIL $name: exit code $r (want a clean error)"; fails=$((fails + 1))
  elif ! grep -qF -- "$want" <<<"$o"; then
    echo "FAIL $name: output lacks '$want': $(tail -2 <<<"$o")"; fails=$((fails + 1))
  else
    echo "ok   $name: $(grep -F -- "$want" <<<"$o" | head -1 | cut -c1-160)"
  fi
}
expect zero-beams "beams: 0 is out of range" --beams 0
expect width "beam width: 3" --beams 4 --beam-width 3
expect step-zero "step tokens: 0 is out of range" --beams 4 --step-tokens 0
expect step-big "step tokens: 9999 is out of range" --beams 4 --step-tokens 9999
expect budget-small "the minimum is" --beams 4 --beam-budget 100K
expect budget-text "--beam-budget: '3 apples'" --beams 4 --beam-budget "3 apples"
expect schedule "beam schedule 'quick'" --beams 4 --beam-schedule quick
expect scorer "/nonexistent/scorer.gguf" --beams 4 --scorer-model /nonexistent/scorer.gguf
expect device "--beam-device: 'gpu' is not a device" --beams 4 --beam-device gpu
# A device that is not there (CI has no GPU; a GPU machine has no 99th).
expect no-gpu "cuda" --beams 4 --beam-device cuda:99
[ $fails -eq 0 ] && echo "all passed" || echo "$fails failed"
exit $((fails > 0))
