#!/usr/bin/env bash
set -u
M=/root/.cache/tokenmill/gguf/SmolLM2-135M-Instruct.Q4_1-bec1d71155329fe0
OUT=/tmp/s24/nice_ab; mkdir -p $OUT
for round in 1 2; do
  for v in 0 1; do
    RENICE=$v python /tmp/s24/nice_launch.py serve --model $M --port 8032 --dtype bfloat16 --max-model-len 2048 --disable-log-stats --quantization none > $OUT/server_${round}_$v.log 2>&1 &
    SPID=$!
    for i in $(seq 120); do curl -sf http://127.0.0.1:8032/health >/dev/null && break; sleep 1; done
    python -m tokenmill.bench.serve serve --base-url http://127.0.0.1:8032 --workload chat --request-rate 4 --num-requests 40 \
      --tokenizer $M --seed 0 --out $OUT/r${round}_renice$v --disable-tqdm > $OUT/bench_${round}_$v.log 2>&1
    kill $SPID; wait $SPID 2>/dev/null
    sed -n 17,19p $OUT/r${round}_renice$v/report.md | tail -1 | awk -F'|' -v r=$round -v v=$v '{print "round",r,"renice",v,"| out tok/s",$6,"| TTFT p50/p99",$11,$12,"| TPOT p50/p99",$13,$14}'
  done
done
