#!/usr/bin/env bash
# strata tune refuses what it cannot do before it measures anything: each case is a real
# child process that must end in a clear error (naming the flag, the path or the size, and
# the problem) within seconds, and leave nothing behind in the directories it was given.
# Usage: tune_errors_test.sh PATH/TO/strata REAL_MODEL.gguf TEXT
set -u
strata="$1"
model="$2"
text="$3"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0

# Stand-ins that pass the checks made before the model loads; no case reaches their content.
touch "$tmp/m.adapters"
mkdir "$tmp/kv" "$tmp/out" "$tmp/outdir" "$tmp/dir.tmp"
touch "$tmp/file"
before=$(cd "$tmp" && find . | sort)

# expect NAME EXPECTED_TEXT -- tune flags...: a clean error within 30 s that says the text.
expect() {
  local name="$1" want="$2"
  shift 3
  local out rc
  out=$(timeout 30 "$strata" tune -m "$model" "$@" 2>&1 </dev/null)
  rc=$?
  if [ $rc -eq 0 ] || [ $rc -ge 124 ]; then
    echo "FAIL $name: exit code $rc (want a clean error)"; echo "$out" | tail -3; fails=$((fails + 1))
  elif ! grep -qF -- "$want" <<<"$out"; then
    echo "FAIL $name: output lacks '$want':"; echo "$out" | tail -3 | cut -c1-300; fails=$((fails + 1))
  elif grep -q "profiling" <<<"$out"; then
    echo "FAIL $name: refused only after measuring:"; echo "$out" | tail -3; fails=$((fails + 1))
  else
    echo "ok   $name: $(grep -F -- "$want" <<<"$out" | head -1 | cut -c1-200)"
  fi
}

# Flags every case shares: the inputs, the KV and work directories.
ok=(--text "$text" --adapters "$tmp/m.adapters" --kv-dir "$tmp/kv" --work-dir "$tmp/work")

# Where the results go: checked first, whatever --force says.
expect out-dir "-o '$tmp/outdir' is a directory" -- "${ok[@]}" --force -o "$tmp/outdir"
expect out-dir-tmp "'$tmp/dir.tmp', where the result is written before it is renamed to $tmp/dir, is a directory" -- "${ok[@]}" -o "$tmp/dir"
expect out-no-dir "-o '$tmp/none/t.yaml': its directory '$tmp/none' does not exist" -- "${ok[@]}" -o "$tmp/none/t.yaml"
expect out-device "-o '/dev/null' is a character device, not a regular file" -- "${ok[@]}" --force -o /dev/null
expect out-exists "$tmp/file exists; give another -o or --force" -- "${ok[@]}" -o "$tmp/file"
expect report-dir "--report '$tmp/outdir' is a directory" -- "${ok[@]}" -o "$tmp/out/t.yaml" --report "$tmp/outdir"
expect report-exists "$tmp/file exists; give another --report or --force" -- "${ok[@]}" -o "$tmp/out/t.yaml" --report "$tmp/file"
expect plot-no-dir "--plot '$tmp/none/p.svg': its directory '$tmp/none' does not exist" -- "${ok[@]}" -o "$tmp/out/t.yaml" --plot "$tmp/none/p.svg"
expect same-file "-o and --report name the same file" -- "${ok[@]}" -o "$tmp/out/t.yaml" --report "$tmp/outdir/../out/t.yaml"
# What it reads, and the directories it writes in.
expect text-missing "--text '$tmp/none.txt' does not exist" -- --text "$tmp/none.txt" --adapters "$tmp/m.adapters" --kv-dir "$tmp/kv" -o "$tmp/out/t.yaml"
expect text-dir "--text '$tmp/outdir' is a directory, not a regular file" -- --text "$tmp/outdir" --adapters "$tmp/m.adapters" --kv-dir "$tmp/kv" -o "$tmp/out/t.yaml"
expect adapters-missing "--adapters '$tmp/none.adapters' does not exist" -- --text "$text" --adapters "$tmp/none.adapters" --kv-dir "$tmp/kv" -o "$tmp/out/t.yaml"
expect kv-dir-missing "--kv-dir '$tmp/none' does not exist" -- --text "$text" --adapters "$tmp/m.adapters" --kv-dir "$tmp/none" -o "$tmp/out/t.yaml"
expect kv-dir-file "--kv-dir '$tmp/file' is a regular file, not a directory" -- --text "$text" --adapters "$tmp/m.adapters" --kv-dir "$tmp/file" -o "$tmp/out/t.yaml"
expect work-dir-file "--work-dir '$tmp/file' is a regular file, not a directory" -- --text "$text" --adapters "$tmp/m.adapters" --kv-dir "$tmp/kv" --work-dir "$tmp/file" -o "$tmp/out/t.yaml"
expect work-dir-below-file "--work-dir '$tmp/file/w': '$tmp/file' is a regular file, not a directory" -- --text "$text" --adapters "$tmp/m.adapters" --kv-dir "$tmp/kv" --work-dir "$tmp/file/w" -o "$tmp/out/t.yaml"
mkdir -p "$tmp/wq/quality.jsonl"
expect work-file-dir "--work-dir: '$tmp/wq/quality.jsonl' is a directory, not a regular file" -- --text "$text" --adapters "$tmp/m.adapters" --kv-dir "$tmp/kv" --work-dir "$tmp/wq" -o "$tmp/out/t.yaml"
rm -r "$tmp/wq"

# Sizes: one parser for K, M, G and T (with or without iB), exact; then the machine.
expect size-suffix "--memory: '12X': unknown suffix 'X' (use K, M, G or T)" -- "${ok[@]}" --memory 12X -o "$tmp/out/t.yaml"
expect size-garbage "--kv-memory: 'lots' is not a number" -- "${ok[@]}" --kv-memory lots -o "$tmp/out/t.yaml"
expect size-zero "--memory: '0' is not a positive size" -- "${ok[@]}" --memory 0 -o "$tmp/out/t.yaml"
expect size-huge "--memory 976.6 TiB is more than this machine's memory" -- "${ok[@]}" --memory 999999G -o "$tmp/out/t.yaml"
expect size-tera "--memory 999.0 TiB is more than this machine's memory" -- "${ok[@]}" --memory 999TiB -o "$tmp/out/t.yaml"
expect kv-size-huge "--kv-memory 976.6 TiB is more than this machine's memory" -- "${ok[@]}" --kv-memory 999999G -o "$tmp/out/t.yaml"
# Past the model's loading: a byte is less than its weights, and says so in bytes.
expect size-byte "--memory 1 B leaves no room for KV: the model's weights alone take" -- "${ok[@]}" --memory 1 -o "$tmp/out/t.yaml"

after=$(cd "$tmp" && find . | sort)
if [ "$before" != "$after" ]; then
  echo "FAIL left behind: $(diff <(echo "$before") <(echo "$after") | grep '^>' | tr '\n' ' ')"
  fails=$((fails + 1))
fi
[ "$fails" -eq 0 ] || { echo "$fails failed"; exit 1; }
echo "tune errors: ok"
