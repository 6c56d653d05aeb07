#!/usr/bin/env bash
# strata tune end to end on the real model: calibrate small adapters, tune one small grid
# into a fresh file with a JSON report, then run with the result and see the entry applied.
# Usage: tune_test.sh PATH/TO/strata REAL_MODEL.gguf TEXT
set -eu
strata="$1"
model="$2"
text="$3"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

"$strata" calibrate -m "$model" --text "$text" --tokens 1024 --window 512 --ratios 4,8 \
  -o "$tmp/m.adapters" -t 2 >/dev/null 2>&1 || fail "calibrate"
# Memory that no plan fits is refused before anything is measured: KV memory below the
# least plan (which the error names), and a process whose measured needs leave no KV room.
refused() {
  local want="$1"
  shift
  local out
  out=$(timeout 60 "$strata" tune -m "$model" --adapters "$tmp/m.adapters" --text "$text" \
    --contexts 512 --batches 1 --windows 1 --kv-dir "$tmp" --work-dir "$tmp/work" \
    -o "$tmp/strata.yaml" "$@" 2>&1) && fail "tune $* succeeded"
  grep -qF -- "$want" <<<"$out" || fail "tune $*: no '$want': $out"
  if grep -q "profiling" <<<"$out"; then fail "tune $* measured before refusing: $out"; fi
  return 0
}
refused "--kv-memory 1 B of KV memory for a batch: at batch 1 and context 512 a sequence gets 1 B, where neither full KV (11.2 MiB) nor any disk plan fits; the least the tuner can plan with is" --kv-memory 1
refused "--memory 150.0 MiB leaves no room for KV: the process needs" --memory 150M
[ ! -e "$tmp/strata.yaml" ] && [ ! -e "$tmp/work" ] || fail "a refused tune left files behind"
# 512 tokens of context take 11.25 MiB of full KV: 4 MiB forces the disk policy.
"$strata" tune -m "$model" --adapters "$tmp/m.adapters" --text "$text" --quick \
  --contexts 512 --batches 1 --windows 1 --scored 16 --verify-steps 4 --max-candidates 3 --max-variants 2 \
  --max-ppl-loss 0.5 --kv-memory 4M --kv-dir "$tmp" --work-dir "$tmp/work" -t 2 \
  --validate 1 --repeat-checks=2 -o "$tmp/strata.yaml" --report "$tmp/report.json" --plot "$tmp/plot.svg" \
  >"$tmp/out.txt" 2>"$tmp/err.txt" ||
  { tail -5 "$tmp/err.txt"; fail "tune"; }
grep -q "wrote $tmp/strata.yaml" "$tmp/out.txt" || fail "no 'wrote' line: $(cat "$tmp/out.txt")"
# The work directory holds the model's activations on the text: its owner's only, with no
# temporary file left.
[ "$(stat -c %a "$tmp/work")" = 700 ] || fail "work directory mode $(stat -c %a "$tmp/work")"
ls "$tmp/work"/*.kvcap "$tmp/work/quality.jsonl" >/dev/null || fail "no work files: $(ls "$tmp/work")"
for f in "$tmp/work"/*; do
  [ "$(stat -c %a "$f")" = 600 ] || fail "$f has mode $(stat -c %a "$f")"
  case "$f" in *.tmp) fail "temporary file left: $f" ;; esac
done
grep -q "^| 1 | 512 | disk |" "$tmp/out.txt" || fail "no disk entry: $(cat "$tmp/out.txt")"
python3 - "$tmp/report.json" <<'PY' || fail "report"
import json, sys
r = json.load(open(sys.argv[1]))
assert r["kind"] == "strata.tune_report", r["kind"]
c = r["choices"][0]
assert c["policy"] == "disk" and c["measured_tokens_per_second"] > 0, c
assert 0 < len(c["candidates"]) <= 5 and any(k["within_bound"] for k in c["candidates"]), c
# The bound holds each plan's upper loss estimate; the defaults ran beside the choice.
assert all(k["ppl_loss_upper"] >= k["ppl_loss"] for k in c["candidates"]), c
assert all(k["within_bound"] == (k["ppl_loss_upper"] <= 0.5) for k in c["candidates"]), c
assert c["default_tokens_per_second"] > 0, c
assert len(r["device"]["reads"]) > 0 and r["compute"]["attention_seconds_per_token"] > 0
# Q8_0 records priced at the plans' group sizes (the runtime's own, 5 here, among them), for
# one sequence only (batch 1), within their bounds: at most half of F16 attention saved.
q8 = r["compute"]["q8_records"]
assert [e["group_size"] for e in q8] == [4, 5, 8, 16], q8
per_layer = r["compute"]["attention_seconds_per_token"] / 30  # the model's 30 layers
assert all(-0.5 * per_layer <= e["seconds_per_token"] <= per_layer for e in q8), q8
assert all("seconds_per_token_many" not in e for e in q8), q8
# Every fitting run of the disk policy's constants is in the report beside the fit's
# prediction of it (batch 1 alone: the grid's largest batch).
fit = r["compute"]["disk_fit"]
assert len(fit) == r["compute"]["disk_fit_runs"] > 0, r["compute"]
assert all(f["batch"] == 1 and f["step_seconds"] > 0 and f["predicted_step_seconds"] > 0
           and f["record_type"] in ("f16", "q8_0") for f in fit), fit
# --repeat-checks=2: every run measured in two more rounds, and only those; the first round's
# figure is the remeasured one.
assert c["remeasured_tokens_per_second"] > 0, c
assert len(c["measured_again_tokens_per_second"]) == 2, c
assert c["measured_again_tokens_per_second"][0] == c["remeasured_tokens_per_second"], c
for k in c["candidates"]:
    if k["settings"] != c["settings"]:
        ran = k["measured_tokens_per_second"] > 0
        assert (k["remeasured_tokens_per_second"] > 0) == ran, k
        assert len(k["measured_again_tokens_per_second"]) == (2 if ran else 0), k
PY
grep -q "^the .* runs measured twice: the two step times apart by: median" "$tmp/out.txt" ||
  fail "no repeat line: $(cat "$tmp/out.txt")"
grep -q "^cost model against the median of each run's 3 step times: error: median" "$tmp/out.txt" ||
  fail "no median line: $(cat "$tmp/out.txt")"
# The plot is an SVG with the chosen plan and the other plans that ran on the speed panel
# and every measured plan on the quality panel.
python3 - "$tmp/plot.svg" "$tmp/report.json" <<'PY' || fail "plot"
import json, sys
import xml.etree.ElementTree as ET
svg = ET.parse(sys.argv[1]).getroot()
assert svg.tag.endswith("svg"), svg.tag
r = json.load(open(sys.argv[2]))
c = r["choices"][0]
ran = 1 + sum(1 for k in c["candidates"]
              if k["measured_tokens_per_second"] > 0 and k["settings"] != c["settings"])
titles = [t.text for t in svg.iter("{http://www.w3.org/2000/svg}title")]
# The choice, one runner-up (--quick) where another plan kept the bound, one --validate run.
others = sum(1 for k in c["candidates"] if k["within_bound"] and k["settings"] != c["settings"])
assert ran == 2 + min(1, others), c
# One point per run, one per measured plan, and a ring on the chosen one.
assert len(titles) == ran + len(c["candidates"]) + 1, (ran, len(titles))
PY
# The tuned file runs, and --stats names the entry it applied; a flag still overrides it.
out=$("$strata" run -m "$model" --config "$tmp/strata.yaml" -p "Hello" -n 4 --stats 2>&1 >/dev/null)
grep -q '"tuned": "batch 1, context 512' <<<"$out" || fail "no tuned entry in --stats: $out"
grep -q '"kv_policy": "disk"' <<<"$out" || fail "the entry's policy was not applied: $out"
out=$("$strata" run -m "$model" --config "$tmp/strata.yaml" --kv memory -p "Hello" -n 4 --stats 2>&1 >/dev/null)
grep -q '"kv_policy": "memory"' <<<"$out" || fail "--kv did not override the entry: $out"
# Off a terminal the log is plain lines: no progress bar, no escape sequences.
if grep -q $'[\r\033]' "$tmp/err.txt"; then fail "progress bar drawn into a file"; fi
# Resumed: a second tune measures no quality window again (no variants: which of them the
# first tune measured follows its measured speeds, which differ from run to run). It runs
# on a terminal (script gives it one), where the progress bar with its ETA is drawn.
script -qec "'$strata' tune -m '$model' --adapters '$tmp/m.adapters' --text '$text' --quick \
  --contexts 512 --batches 1 --windows 1 --scored 16 --verify-steps 4 --max-candidates 3 --max-variants 0 \
  --max-ppl-loss 0.5 --kv-memory 4M --kv-dir '$tmp' --work-dir '$tmp/work' -t 2 \
  -o '$tmp/again.yaml'" /dev/null >"$tmp/tty.txt" 2>&1 || fail "second tune: $(tail -3 "$tmp/tty.txt")"
grep -q "device profile \[#*\.*\] [0-9]/[0-9]" "$tmp/tty.txt" || fail "no progress bar on a terminal"
grep -q "ETA" "$tmp/tty.txt" || fail "no ETA on a terminal"
fresh=$(tr '\r' '\n' <"$tmp/tty.txt" | grep ": ppl" | grep -vc "(cached)" || true)
[ "$fresh" -eq 0 ] || fail "the second tune measured $fresh plans again"
echo "tune end to end: ok"
