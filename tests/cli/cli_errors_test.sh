#!/usr/bin/env bash
# Bad input to the `strata` command gives a clear error (naming the file, key or limit)
# and a plain non-zero exit, never a crash (exit >= 128) or a hang.
# Usage: cli_errors_test.sh PATH/TO/strata REAL_MODEL.gguf
set -u
strata="$1"
model="$2"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0

# expect NAME EXPECTED_TEXT -- command...
expect() {
  local name="$1" want="$2"
  shift 3
  local out rc
  out=$(timeout 120 "$@" 2>&1 </dev/null)
  rc=$?
  if [ $rc -eq 0 ] || [ $rc -ge 124 ]; then
    echo "FAIL $name: exit code $rc (want a clean error)"; echo "$out" | tail -5; fails=$((fails + 1))
  elif ! grep -qF -- "$want" <<<"$out"; then
    echo "FAIL $name: output lacks '$want':"; echo "$out" | tail -5 | cut -c1-300; fails=$((fails + 1))
  else
    echo "ok   $name: $(grep -F -- "$want" <<<"$out" | head -1 | cut -c1-200)"
  fi
}

head -c 100000 "$model" >"$tmp/truncated.gguf"
printf 'GGUX\003\000\000\000' >"$tmp/magic.gguf"; head -c 4096 /dev/zero >>"$tmp/magic.gguf"
printf 'GGUF\011\000\000\000' >"$tmp/version.gguf"; head -c 4096 /dev/zero >>"$tmp/version.gguf"
printf 'threads: 2\nsampling:\n  temprature: 0.5\n' >"$tmp/typo.yaml"
printf 'batch: 0\n' >"$tmp/range.yaml"
printf 'threads: [1,\n' >"$tmp/syntax.yaml"
printf 'bad \xff byte' >"$tmp/badutf8.txt"
head -c 40000 /dev/zero | tr '\0' 'a' | sed 's/aaaa/ab c/g' >"$tmp/long.txt"

expect missing-model "/nonexistent.gguf" -- "$strata" run -m /nonexistent.gguf -p hi
expect truncated "truncated.gguf" -- "$strata" run -m "$tmp/truncated.gguf" -p hi
expect bad-magic "magic" -- "$strata" info -m "$tmp/magic.gguf"
expect bad-version "version" -- "$strata" info -m "$tmp/version.gguf"
expect yaml-typo "did you mean 'sampling.temperature'" -- "$strata" run -m "$model" --config "$tmp/typo.yaml" -p hi
expect yaml-range "batch: 0 is out of range [1, 8192]" -- "$strata" run -m "$model" --config "$tmp/range.yaml" -p hi
expect yaml-syntax "syntax.yaml:" -- "$strata" run -m "$model" --config "$tmp/syntax.yaml" -p hi
expect yaml-missing "/nonexistent.yaml" -- "$strata" run -m "$model" --config /nonexistent.yaml -p hi
expect bad-utf8 "UTF-8" -- "$strata" run -m "$model" -f "$tmp/badutf8.txt" -n 4
expect long-prompt "context" -- "$strata" run -m "$model" --ctx 256 -f "$tmp/long.txt" -n 4
expect bad-kv "unknown KV policy 'ssd'" -- "$strata" run -m "$model" --kv ssd -p hi
expect bad-temp "sampling.temperature" -- "$strata" run -m "$model" --temp -1 -p hi
expect ppl-score-from "--score-from: 1023 is outside 0..1022" -- "$strata" perplexity -m "$model" -f "$tmp/long.txt" --score-from 1023

mkfifo "$tmp/fifo"
mkdir "$tmp/dir.yaml"
printf 'threads: 2\nthreads: 3\n' >"$tmp/dup.yaml"
expect empty-model "-m: the model path is empty" -- "$strata" info -m ''
expect fifo-model "is a FIFO, not a regular file" -- "$strata" info -m "$tmp/fifo"
expect dir-model "is a directory, not a regular file" -- "$strata" run -m "$tmp" -p hi
expect dir-config "is a directory, not a regular file" -- "$strata" run -m "$model" --config "$tmp/dir.yaml" -p hi
expect dev-config "/dev/zero' is a character device" -- "$strata" run -m "$model" --config /dev/zero -p hi
expect dup-config "given twice (first on line 1)" -- "$strata" run -m "$model" --config "$tmp/dup.yaml" -p hi
expect disk-flag-memory "--kv-dir applies only with the disk KV policy" -- "$strata" run -m "$model" --kv-dir "$tmp" -p hi
expect budget-flag-memory "--kv-budget applies only with the disk KV policy" -- "$strata" run -m "$model" --kv memory --kv-budget 1000000 -p hi
expect beams-disk "kv.policy disk does not apply" -- "$strata" run -m "$model" --kv disk --beams 4 -p hi
expect verifier-share "--verifier-share: verifier share: 'half' is neither auto nor a share in [0, 1]" -- \
  "$strata" run -m "$model" --beams 4 --scorer-model "$model" --beam-budget 8M --verifier-share half -p hi
expect shared-budget-min "holds the scorer model's KV too" -- \
  "$strata" run -m "$model" --beams 4 --scorer-model "$model" --beam-budget 3M -n 64 -p hi
expect seed-range "sampling.seed: 9223372036854775808 is out of range" -- "$strata" run -m "$model" --seed 9223372036854775808 -p hi -n 2

# A prompt source is a regular file, a pipe or a terminal, read no further than the context
# can hold (without the limit, an endless source grows the process until the timeout).
expect dev-zero-prompt "prompt file '/dev/zero' is a character device, not a regular file, a pipe or a terminal" -- \
  "$strata" run -m "$model" -f /dev/zero -n 2
expect dev-zero-stdin "stdin is a character device" -- bash -c '"$0" run -m "$1" -n 2 </dev/zero' "$strata" "$model"
expect endless-pipe "stdin holds more than 663552 bytes; the limit is 663552 bytes (a context of 8192 tokens" -- \
  bash -c 'cat /dev/zero | "$0" run -m "$1" -n 2' "$strata" "$model"
expect dir-prompt "prompt file '/etc' is a directory" -- bash -c 'echo hi | "$0" run -m "$1" -f /etc -n 2' "$strata" "$model"
expect prompt-twice "-p and -f are alternatives" -- "$strata" run -m "$model" -p hi -f "$tmp/long.txt"
head -c 30000 "$tmp/long.txt" >"$tmp/system.txt"
expect long-system "--system holds 30000 bytes; the limit is 20736 bytes" -- \
  "$strata" run -m "$model" --ctx 256 --chat --system "$(cat "$tmp/system.txt")" -p hi

# A flag that does not apply to the mode being run names what it needs (every flag is walked
# by cli_flag_modes_test; these are the ones users tripped on).
expect scorer-no-beams "--scorer-model applies only with --beams N" -- "$strata" run -m "$model" --scorer-model /etc/passwd -p hi
expect system-no-chat "--system applies only with --chat" -- "$strata" run -m "$model" --system x -p hi
expect gpu-weights-cpu "--gpu-weights applies only with --device cuda" -- "$strata" run -m "$model" --gpu-weights device -p hi
expect slow-dir-no-budget "--beam-slow-dir applies only with --beams N and --beam-budget" -- \
  "$strata" run -m "$model" --beams 2 --beam-slow-dir "$tmp" -p hi

# A context out of range is refused before any warning about it.
out=$(timeout 120 "$strata" run -m "$model" --ctx 99999999 -p hi -n 2 2>&1 >/dev/null)
if grep -q "context: 99999999 is out of range" <<<"$out" && ! grep -q "warning" <<<"$out"; then
  echo "ok   ctx-range: $out"
else
  echo "FAIL ctx-range: $out"; fails=$((fails + 1))
fi

# An interactive chat line longer than the context can hold is refused and the chat goes on
# (a pseudo-terminal from script(1); a terminal's line holds at most 4095 bytes).
{ head -c 3500 /dev/zero | tr '\0' 'a'; printf '\nhi\n\n'; } >"$tmp/chat.txt"
out=$(timeout 120 script -qec "'$strata' run -m '$model' --chat --ctx 40 -n 4 --temp 0" /dev/null \
  <"$tmp/chat.txt" 2>&1)
rc=$?
if [ $rc -eq 0 ] && grep -q "the line holds more than 3240 bytes" <<<"$out" &&
   [ "$(grep -c '^> ' <<<"$out")" -ge 3 ]; then
  echo "ok   chat-line: $(grep -o 'the line holds.*' <<<"$out" | cut -c1-120)"
else
  echo "FAIL chat-line: exit $rc: $(tail -c 600 <<<"$out")"; fails=$((fails + 1))
fi


# strata tune refuses what it cannot do before it measures anything (more cases in
# tune_errors_test.sh). An empty adapters file stands in where a case needs one to get past
# the inputs' checks: none reads it.
touch "$tmp/m.adapters"
expect tune-output "-o '$tmp/nodir/strata.yaml': its directory '$tmp/nodir' does not exist" -- "$strata" tune -m "$model" --text "$tmp/long.txt" -o "$tmp/nodir/strata.yaml"
expect tune-exists "typo.yaml exists; give another -o or --force" -- "$strata" tune -m "$model" --text "$tmp/long.txt" -o "$tmp/typo.yaml"
expect tune-memory "--memory: '12X': unknown suffix 'X' (use K, M, G or T)" -- "$strata" tune -m "$model" --text "$tmp/long.txt" --memory 12X -o "$tmp/t.yaml"
expect tune-memory-both "--memory (the whole process) and --kv-memory (KV of a batch) are alternatives" -- "$strata" tune -m "$model" --text "$tmp/long.txt" --memory 1G --kv-memory 64M -o "$tmp/t.yaml"
expect tune-memory-small "--memory 64.0 MiB leaves no room for KV: the model's weights alone take" -- "$strata" tune -m "$model" --text "$tmp/long.txt" --adapters "$tmp/m.adapters" --contexts 512 --windows 1 --memory 64M -o "$tmp/t.yaml"
expect tune-text "$tmp/missing.txt" -- "$strata" tune -m "$model" --text "$tmp/missing.txt" -o "$tmp/t.yaml"
expect tune-report-exists "typo.yaml exists; give another --report or --force" -- "$strata" tune -m "$model" --text "$tmp/long.txt" -o "$tmp/t.yaml" --report "$tmp/typo.yaml"
expect tune-plot "--plot '$tmp/nodir/plot.svg': its directory '$tmp/nodir' does not exist" -- "$strata" tune -m "$model" --text "$tmp/long.txt" -o "$tmp/t.yaml" --plot "$tmp/nodir/plot.svg"
expect tune-device "--device: 'npu:0' is not a device (cpu, cuda or cuda:N)" -- "$strata" tune -m "$model" --text "$tmp/long.txt" -o "$tmp/t.yaml" --device npu:0
expect tune-device-absent "tune: --device cuda:99: " -- "$strata" tune -m "$model" --text "$tmp/long.txt" -o "$tmp/t.yaml" --device cuda:99
expect tune-kv-dir "--kv-dir '$tmp/nodir' does not exist" -- "$strata" tune -m "$model" --text "$tmp/long.txt" --adapters "$tmp/m.adapters" --contexts 512 --windows 1 --kv-dir "$tmp/nodir" -o "$tmp/t.yaml"

# Settings tuned for another model and machine still apply, with a warning saying so.
printf 'tuned:\n  - {batch: 1, context: 512, settings: {kv.policy: memory}}\nprovenance:\n  model_identity: "0000000000000000"\n  machine: "cpu=elsewhere"\n' >"$tmp/other.yaml"
out=$(timeout 120 "$strata" run -m "$model" --config "$tmp/other.yaml" --ctx 512 -p hi -n 2 --stats 2>&1 >/dev/null)
if grep -q "was tuned for another model" <<<"$out" && grep -q "tuned on another machine" <<<"$out" &&
   grep -q '"tuned": "batch 1, context 512' <<<"$out"; then
  echo "ok   tuned-elsewhere: $(grep -o 'warning.*another model' <<<"$out" | head -1 | cut -c1-120)"
else
  echo "FAIL tuned-elsewhere: $out" | head -5; fails=$((fails + 1))
fi

# A context beyond the training context runs, with a warning.
out=$(timeout 120 "$strata" run -m "$model" --ctx 9000 -p hi -n 2 2>&1 >/dev/null)
if grep -q "beyond the 8192 this model was trained on" <<<"$out"; then
  echo "ok   ctx-warning: $(grep -o 'warning.*' <<<"$out" | cut -c1-120)"
else
  echo "FAIL ctx-warning: no warning for --ctx 9000: $out"; fails=$((fails + 1))
fi

[ $fails -eq 0 ] && echo "all CLI error checks passed"
exit $fails
