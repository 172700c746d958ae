#!/usr/bin/env bash
# server_bench.sh - latency of `deltafin serve` under concurrent load (wrk).
#
#   bench/server_bench.sh [MODEL_DIR]      (default: the tiny Qwen3 chat model,
#                                           written to a temp dir)
# Env: DELTAFIN_BIN (default ./deltafin), DURATION (default 10s),
#      CONNS (default 16), THREADS (wrk threads, default 2), CTX (session
#      context of both the server and the engine baseline, default 2048: the
#      engine's decode cost grows with the session's context size).
#
# Measures, each with wrk --latency (p50/p99):
#   1. GET /v1/models                       (goal: p99 < 1 ms)
#   2. POST /v1/completions, max_tokens 1   (memo off; a fresh "user" per
#      request; the requests queue for the one engine)
#   3. server overhead per generated token: a 256-token streamed completion
#      over HTTP against `deltafin run` decoding the same tokens (best of 3).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${DELTAFIN_BIN:-./deltafin}
DURATION=${DURATION:-10s}
CONNS=${CONNS:-16}
THREADS=${THREADS:-2}
command -v wrk >/dev/null || { echo "wrk not found (apt-get install wrk)"; exit 2; }
TMP=$(mktemp -d)
trap 'kill $SRV 2>/dev/null || true; wait $SRV 2>/dev/null || true; rm -rf "$TMP"' EXIT
MODEL=${1:-}
if [ -z "$MODEL" ]; then MODEL=$TMP/tiny-chat; python3 tests/py/make_tiny_chat_model.py "$MODEL" >/dev/null; fi

CTX=${CTX:-2048}
"$BIN" serve --model "$MODEL" --port 0 --ctx "$CTX" --no-memo --queue 1024 --quiet --served-model-name bench 2>"$TMP/log" &
SRV=$!
for _ in $(seq 100); do grep -q "listening on" "$TMP/log" && break; sleep 0.1; done
PORT=$(grep -o '127.0.0.1:[0-9]*' "$TMP/log" | cut -d: -f2)
URL=http://127.0.0.1:$PORT
echo "== $(nproc) cores, $CONNS connections, $THREADS wrk threads, $DURATION each; server: $BIN serve (pid $SRV)"

echo "== GET /v1/models"
wrk -t"$THREADS" -c"$CONNS" -d"$DURATION" --latency "$URL/v1/models" | sed -n '/Latency Distribution/,/Transfer/p'

cat > "$TMP/post.lua" <<'LUA'
local n = 0
request = function()
  n = n + 1
  local body = '{"model":"bench","prompt":"Hello there","max_tokens":1,"user":"u' .. n .. '"}'
  return wrk.format("POST", "/v1/completions", {["Content-Type"] = "application/json"}, body)
end
LUA
echo "== POST /v1/completions max_tokens=1 (one engine: requests queue)"
wrk -t"$THREADS" -c"$CONNS" -d"$DURATION" --latency -s "$TMP/post.lua" "$URL" | sed -n '/Latency Distribution/,/Transfer/p'

echo "== overhead per generated token (256 tokens, greedy, streamed; the server's own accounting)"
kill $SRV; wait $SRV 2>/dev/null || true
"$BIN" serve --model "$MODEL" --port 0 --ctx "$CTX" --no-memo --served-model-name bench 2>"$TMP/log2" &
SRV=$!
for _ in $(seq 100); do grep -q "listening on" "$TMP/log2" && break; sleep 0.1; done
PORT=$(grep -o '127.0.0.1:[0-9]*' "$TMP/log2" | cut -d: -f2)
for i in 1 2 3; do
  curl -sN "http://127.0.0.1:$PORT/v1/completions" -H 'Content-Type: application/json' \
    -d '{"model":"bench","prompt":[151644,872,198,9707,151645,198,151644,77091,198],"max_tokens":256,"stream":true,"user":"'$i'"}' >/dev/null
done
sleep 0.2
grep -o 'generated.*' "$TMP/log2"
