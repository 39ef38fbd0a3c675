#!/usr/bin/env bash
# `tokenmill serve` with the KV prefault on and off, alternated twice; chat and long/short mix at
# 2 and 4 req/s, 30 requests each, measured by `tokenmill bench serve` right after the server is ready.
#   bash benchmarks/serve_prefault_ab.sh [OUT_DIR]      (default: out/prefault-ab)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-out/prefault-ab}
mkdir -p "$OUT"
MODEL=$(python -c "from tokenmill.models.default_model import resolve_default_model; print(resolve_default_model())")
PORT=8013
for rnd in 1 2; do
  for v in on off; do
    flag=--kv-cache-prefault; [ "$v" = off ] && flag=--no-kv-cache-prefault
    python -m tokenmill.cli serve --model "$MODEL" --port $PORT --dtype bfloat16 --max-model-len 2048 \
      --disable-log-stats --quantization none $flag > "$OUT/server_${v}_$rnd.log" 2>&1 &
    pid=$!
    for _ in $(seq 120); do curl -sf http://127.0.0.1:$PORT/v1/models > /dev/null && break; sleep 1; done
    for w in chat long-short-mix; do
      python -m tokenmill.bench.serve serve --base-url http://127.0.0.1:$PORT --workload $w --sweep 2,4 \
        --num-requests 30 --tokenizer "$MODEL" --seed 0 --out "$OUT/$v$rnd/$w" --disable-tqdm > /dev/null
    done
    kill $pid; wait $pid || true
  done
done
