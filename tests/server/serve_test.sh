#!/usr/bin/env bash
# strata serve end to end on a loopback port: answers at temperature 0 equal `strata run`'s
# (alone, concurrently, and after a prompt prefix was reused), streaming, stop strings, usage,
# the API's refusals, a client that leaves mid-stream, and a clean exit on SIGTERM.
# Usage: serve_test.sh STRATA MODEL
set -euo pipefail
strata=$1
model=$2
[ -f "$model" ] || { echo "model $model missing (scripts/fetch_model.sh)" >&2; exit 1; }
work=$(mktemp -d)
pid=""
log=""
cleanup() {
  [ -n "$pid" ] && kill -9 "$pid" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT
fail() {
  echo "FAIL: $*" >&2
  [ -f "$log" ] && tail -n 20 "$log" >&2
  exit 1
}

# A small context keeps the KV of four slots small; the answers do not depend on it.
common=(-m "$model" --ctx 1024 -t 2)
key=test-key-1234
echo "$key" >"$work/key"
log=$work/server.log
"$strata" serve "${common[@]}" --port 0 --parallel 4 --queue 8 --api-key-file "$work/key" \
  2>"$log" &
pid=$!
port=""
for _ in $(seq 300); do
  # The background shell may not have created the log yet.
  port=$(sed -n 's|.*listening on http://127\.0\.0\.1:\([0-9]*\).*|\1|p' "$log" 2>/dev/null || true)
  [ -n "$port" ] && break
  kill -0 "$pid" 2>/dev/null || fail "the server exited before listening"
  sleep 0.1
done
[ -n "$port" ] || fail "the server did not listen within 30 s"
base=http://127.0.0.1:$port

# api PATH BODY OUT: POSTs with the key; prints the HTTP status.
api() {
  curl -s --max-time 60 -o "$3" -w '%{http_code}' -H "Authorization: Bearer $key" \
    -H 'Content-Type: application/json' --data-binary "$2" "$base$1"
}
json() { python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print($2)" "$1"; }

for _ in $(seq 50); do
  curl -sf --max-time 2 "$base/health" >"$work/health" 2>/dev/null && break
  sleep 0.1
done
grep -q '"status":"ok"' "$work/health" || fail "/health"

# --- chat, not streamed, equals strata run --chat ------------------------------------------
question="What is the capital of France?"
"$strata" run "${common[@]}" --chat -p "$question" --temp 0 -n 24 >"$work/run_chat"
code=$(api /v1/chat/completions \
  "{\"messages\":[{\"role\":\"user\",\"content\":\"$question\"}],\"temperature\":0,\"max_tokens\":24}" \
  "$work/chat")
[ "$code" = 200 ] || fail "chat: status $code: $(cat "$work/chat")"
python3 - "$work/run_chat" "$work/chat" <<'PY' || fail "chat text differs from strata run"
import json, sys
want = open(sys.argv[1], encoding="utf-8").read()
d = json.load(open(sys.argv[2]))
got = d["choices"][0]["message"]["content"]
assert want == got + "\n", (want, got)
u = d["usage"]
assert u["prompt_tokens"] > 0 and u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"], u
assert d["choices"][0]["finish_reason"] in ("stop", "length"), d
if d["choices"][0]["finish_reason"] == "length":
    assert u["completion_tokens"] == 24, u
PY
echo "ok: chat equals strata run --chat"

# --- completion, streamed, reassembles to strata run's continuation --------------------------
prompt="Once upon a time"
"$strata" run "${common[@]}" -p "$prompt" --temp 0 -n 20 >"$work/run_text"
code=$(api /v1/completions \
  "{\"prompt\":\"$prompt\",\"temperature\":0,\"max_tokens\":20,\"stream\":true,\"stream_options\":{\"include_usage\":true}}" \
  "$work/stream")
[ "$code" = 200 ] || fail "stream: status $code"
python3 - "$work/run_text" "$work/stream" "$prompt" <<'PY' || fail "streamed text differs"
import json, sys
want = open(sys.argv[1], encoding="utf-8").read()
events = [l[6:] for l in open(sys.argv[2], encoding="utf-8").read().split("\n\n") if l.startswith("data: ")]
assert events[-1] == "[DONE]", events[-1]
chunks = [json.loads(e) for e in events[:-1]]
text = "".join(c["choices"][0]["text"] for c in chunks if c["choices"])
assert want == sys.argv[3] + text + "\n", (want, text)
assert chunks[-2]["choices"][0]["finish_reason"] == "length", chunks[-2]
assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 20, chunks[-1]
PY
echo "ok: streamed completion equals strata run"

# --- stop strings: the text ends right before the first stop string -------------------------
stop=$(python3 -c "import sys; t=open(sys.argv[1]).read()[len(sys.argv[2]):]; print(t.split()[3])" \
  "$work/run_text" "$prompt")
code=$(api /v1/completions \
  "{\"prompt\":\"$prompt\",\"temperature\":0,\"max_tokens\":20,\"stop\":[\"$stop\"]}" "$work/stop")
[ "$code" = 200 ] || fail "stop: status $code"
python3 - "$work/run_text" "$work/stop" "$prompt" "$stop" <<'PY' || fail "stop string"
import json, sys
want = open(sys.argv[1], encoding="utf-8").read()[len(sys.argv[3]):]
d = json.load(open(sys.argv[2]))
got = d["choices"][0]["text"]
assert got == want[:want.index(sys.argv[4])], (got, want)
assert d["choices"][0]["finish_reason"] == "stop", d
PY
echo "ok: stop string"

# --- a prompt that extends a finished one reuses its KV and still equals strata run ----------
p1="The capital of France is"
p2="The capital of France is Paris, and the capital of Italy is"
api /v1/completions "{\"prompt\":\"$p1\",\"temperature\":0,\"max_tokens\":1}" "$work/p1" >/dev/null
"$strata" run "${common[@]}" -p "$p2" --temp 0 -n 8 >"$work/run_p2"
code=$(api /v1/completions "{\"prompt\":\"$p2\",\"temperature\":0,\"max_tokens\":8}" "$work/p2")
[ "$code" = 200 ] || fail "prefix: status $code"
python3 - "$work/run_p2" "$work/p2" "$p2" <<'PY' || fail "prefix reuse"
import json, sys
d = json.load(open(sys.argv[2]))
assert open(sys.argv[1], encoding="utf-8").read() == sys.argv[3] + d["choices"][0]["text"] + "\n", d
assert d["usage"]["prompt_tokens_details"]["cached_tokens"] > 0, d["usage"]
PY
echo "ok: prefix reuse"

# --- refusals ------------------------------------------------------------------------------
expect() {  # expect STATUS PARAM PATH BODY
  local code
  code=$(api "$3" "$4" "$work/err")
  [ "$code" = "$1" ] || fail "$4: status $code, want $1: $(head -c 300 "$work/err")"
  [ -z "$2" ] || [ "$(json "$work/err" 'd["error"]["param"]')" = "$2" ] ||
    fail "$4: param is not $2: $(cat "$work/err")"
}
msg='"messages":[{"role":"user","content":"hi"}]'
expect 400 "" /v1/chat/completions '{'
expect 400 n /v1/chat/completions "{$msg,\"n\":2}"
expect 400 max_tokens /v1/chat/completions "{$msg,\"max_tokens\":1000000000}"
grep -q 'room for at most' "$work/err" || fail "max_tokens error does not give the limit"
expect 400 model /v1/chat/completions "{$msg,\"model\":\"gpt-4\"}"
expect 400 messages /v1/chat/completions '{"messages":[]}'
expect 400 temperature /v1/chat/completions "{$msg,\"temperature\":\"hot\"}"
expect 400 "" /v1/completions "$(printf '{"prompt":"a\xffb"}')"
# About 1,200 tokens against a context of 1,024.
expect 400 prompt /v1/completions "{\"prompt\":\"$(printf 'hello %.0s' $(seq 1200))\"}"
[ "$(json "$work/err" 'd["error"]["code"]')" = context_length_exceeded ] || fail "long prompt code"
model_id=$(basename "$model" .gguf)
expect 200 "" /v1/chat/completions "{$msg,\"model\":\"$model_id\",\"max_tokens\":2}"
head -c 20000000 /dev/zero | tr '\0' a >"$work/big"
code=$(curl -s --max-time 30 -o "$work/err" -w '%{http_code}' -H "Authorization: Bearer $key" \
  -H 'Content-Type: application/json' --data-binary @"$work/big" "$base/v1/completions" || true)
[ "$code" = 413 ] || fail "20 MB body: status $code"
code=$(curl -s --max-time 10 -o "$work/err" -w '%{http_code}' -H "Authorization: Bearer wrong" \
  -d "{$msg}" "$base/v1/chat/completions")
[ "$code" = 401 ] || fail "wrong key: status $code"
[ "$(json "$work/err" 'd["error"]["code"]')" = invalid_api_key ] || fail "401 body"
echo "ok: refusals"

# --- the official client (scripts/install_deps.sh installs it; CI must have it) -------------
if python3 -c 'import openai' 2>/dev/null; then
  python3 "$(dirname "$0")/openai_client_test.py" "$base" "$key" "$model_id" "$question" \
    "$work/run_chat" || fail "openai client"
elif [ -n "${CI:-}" ]; then
  fail "the openai Python package is not installed (scripts/install_deps.sh installs it)"
else
  echo "skip: the openai Python package is not installed (scripts/install_deps.sh installs it)"
fi

# --- four at once give what each gives alone --------------------------------------------------
pids=()
for i in 1 2 3 4; do
  if [ $((i % 2)) = 1 ]; then
    api /v1/chat/completions \
      "{\"messages\":[{\"role\":\"user\",\"content\":\"$question\"}],\"temperature\":0,\"max_tokens\":24}" \
      "$work/c$i" >"$work/c$i.code" &
  else
    api /v1/completions "{\"prompt\":\"$prompt\",\"temperature\":0,\"max_tokens\":20}" \
      "$work/c$i" >"$work/c$i.code" &
  fi
  pids+=($!)
done
wait "${pids[@]}" || true
python3 - "$work" "$prompt" <<'PY' || fail "concurrent answers differ"
import json, sys
w = sys.argv[1]
chat = open(w + "/run_chat", encoding="utf-8").read()
text = open(w + "/run_text", encoding="utf-8").read()
for i in (1, 2, 3, 4):
    assert open(f"{w}/c{i}.code").read() == "200", i
    d = json.load(open(f"{w}/c{i}"))
    if i % 2:
        assert d["choices"][0]["message"]["content"] + "\n" == chat, (i, d)
    else:
        assert sys.argv[2] + d["choices"][0]["text"] + "\n" == text, (i, d)
PY
echo "ok: concurrent"

# --- a client that leaves mid-stream does not stop the server ------------------------------
# wait_stream FILE: until FILE holds an event (at most 10 s).
wait_stream() {
  for _ in $(seq 100); do
    grep -q '^data: ' "$1" 2>/dev/null && return 0
    sleep 0.1
  done
  fail "no event in $1: $(head -c 400 "$1")"
}

# Counting at temperature 0 goes on for hundreds of tokens: the stream is still running when
# its client is killed after the first event.
count='{"prompt":"1, 2, 3, 4, 5, 6, 7, 8,","temperature":0,"max_tokens":900,"stream":true}'
curl -s --max-time 30 -N -H "Authorization: Bearer $key" -d "$count" "$base/v1/completions" \
  >"$work/left" 2>&1 &
left_pid=$!
wait_stream "$work/left"
kill "$left_pid"
wait "$left_pid" || true
grep -q 'DONE' "$work/left" && fail "the counting stream ended before its client left"
code=$(api /v1/completions "{\"prompt\":\"$prompt\",\"temperature\":0,\"max_tokens\":4}" "$work/after")
[ "$code" = 200 ] || fail "request after a disconnect: status $code"
curl -sf --max-time 5 -H "Authorization: Bearer $key" "$base/metrics" >"$work/metrics"
grep -q '^strata_requests_total{endpoint="/v1/completions",status="200"}' "$work/metrics" ||
  fail "metrics lack the request counter"
grep -q '^strata_time_to_first_token_seconds_count [1-9]' "$work/metrics" || fail "metrics: ttft"
grep -q '^strata_active_slots 0' "$work/metrics" || fail "the slot of the client that left is busy"
curl -sf --max-time 5 -H "Authorization: Bearer $key" "$base/v1/models" | grep -q "\"$model_id\"" ||
  fail "/v1/models"
echo "ok: disconnect, metrics, models"

# --- SIGTERM mid-stream: the stream ends with an error event, the server exits 0 ------------
curl -s --max-time 20 -N -H "Authorization: Bearer $key" -d "$count" "$base/v1/completions" \
  >"$work/cut" 2>&1 &
cut_pid=$!
wait_stream "$work/cut"
kill -TERM "$pid"
for _ in $(seq 100); do
  kill -0 "$pid" 2>/dev/null || break
  sleep 0.1
done
kill -0 "$pid" 2>/dev/null && fail "still running 10 s after SIGTERM"
status=0
wait "$pid" || status=$?
pid=""
log=""
[ "$status" = 0 ] || fail "exit status $status after SIGTERM"
wait "$cut_pid" || true
grep -q 'shutting down' "$work/cut" || fail "the cut stream has no error event"
[ "$(tail -n 2 "$work/cut" | head -n 1)" = "data: [DONE]" ] || fail "the cut stream does not end"
echo "ok: SIGTERM"

# --- one slot, no queue: a second request is refused with Retry-After; SIGINT exits 0 -------
# A log of its own: the background shell may not have truncated a reused file when the loop
# below first reads it, which would find the first server's port.
log=$work/server2.log
"$strata" serve "${common[@]}" --port 0 --parallel 1 --queue 0 2>"$log" &
pid=$!
port=""
for _ in $(seq 300); do
  # The background shell may not have created the log yet.
  port=$(sed -n 's|.*listening on http://127\.0\.0\.1:\([0-9]*\).*|\1|p' "$log" 2>/dev/null || true)
  [ -n "$port" ] && break
  sleep 0.1
done
[ -n "$port" ] || fail "the second server did not listen"
base=http://127.0.0.1:$port
curl -s --max-time 20 -N -d "$count" "$base/v1/completions" >"$work/hold" 2>&1 &
hold_pid=$!
wait_stream "$work/hold"
curl -s --max-time 10 -D "$work/headers" -o "$work/err" -d '{"prompt":"a"}' "$base/v1/completions"
grep -q '^HTTP/1.1 503' "$work/headers" || fail "no 503 with the slot busy: $(cat "$work/headers")"
grep -qi '^Retry-After: ' "$work/headers" || fail "503 without Retry-After"
[ "$(json "$work/err" 'd["error"]["code"]')" = queue_full ] || fail "503 body"
kill -INT "$pid"
status=0
wait "$pid" || status=$?
pid=""
log=""
[ "$status" = 0 ] || fail "exit status $status after SIGINT"
wait "$hold_pid" || true
echo "ok: queue full, SIGINT"
