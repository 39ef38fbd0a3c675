#!/usr/bin/env bash
# A/B of two checkouts under tokenmill serve: chat at 4 req/s, 40 requests, alternated twice.
set -u
M=/root/.cache/tokenmill/gguf/SmolLM2-135M-Instruct.Q4_1-bec1d71155329fe0
OUT=${OUT:-/tmp/s24/ab_serve}; mkdir -p $OUT
for round in 1 2; do
  for tree in "$A" "$B"; do
    tag=$(basename $tree)
    (cd /tmp && PYTHONPATH=$tree python -m tokenmill.cli serve --model $M --port 8033 --dtype bfloat16 --max-model-len 2048 --disable-log-stats --quantization none > $OUT/server_${round}_$tag.log 2>&1) &
    SPID=$!
    for i in $(seq 180); do curl -sf http://127.0.0.1:8033/health >/dev/null && break; sleep 1; done
    python -m tokenmill.bench.serve serve --base-url http://127.0.0.1:8033 --workload chat --request-rate 4 --num-requests 40 \
      --tokenizer $M --seed 0 --out $OUT/r${round}_$tag --disable-tqdm > $OUT/bench_${round}_$tag.log 2>&1
    pkill -P $SPID; kill $SPID 2>/dev/null; wait $SPID 2>/dev/null
    python - $OUT/r${round}_$tag $round $tag <<'PY'
import json, glob, sys
d = json.load(open(glob.glob(sys.argv[1] + "/**/results.json", recursive=True)[0]))["summary"]
print(f"round {sys.argv[2]} {sys.argv[3]}: out {d['output_throughput']:.1f} tok/s, TTFT p50 {d['ttft_ms']['p50']:.0f} p99 {d['ttft_ms']['p99']:.0f}, "
      f"TPOT p50 {d['tpot_ms']['p50']:.1f} p99 {d['tpot_ms']['p99']:.1f}, completed {d['completed']}")
PY
  done
done
