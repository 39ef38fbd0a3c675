#!/usr/bin/env bash
# Where the server's threads spend the GIL under load: tokenmill serve (bf16, the default model's folder),
# the chat workload at 4 req/s, py-spy sampling the server process for 25 s in the middle of the run.
set -u
M=/root/.cache/tokenmill/gguf/SmolLM2-135M-Instruct.Q4_1-bec1d71155329fe0
OUT=${OUT:-/tmp/s24/gil}
mkdir -p $OUT
python -m tokenmill.cli serve --model $M --port 8031 --dtype bfloat16 --max-model-len 2048 --disable-log-stats --quantization none > $OUT/server.log 2>&1 &
SPID=$!
for i in $(seq 120); do curl -sf http://127.0.0.1:8031/health >/dev/null && break; sleep 1; done
python -m tokenmill.bench.serve serve --base-url http://127.0.0.1:8031 --workload chat --request-rate 4 --num-requests 60 \
  --tokenizer $M --seed 0 --out $OUT/bench --disable-tqdm > $OUT/bench.log 2>&1 &
BPID=$!
sleep 12
py-spy record -p $SPID --threads --format raw -d 12 -r 200 -o $OUT/oncpu.txt > /dev/null 2>&1
py-spy record -p $SPID --threads --gil --format raw -d 12 -r 200 -o $OUT/gil.txt > /dev/null 2>&1
wait $BPID
kill $SPID; wait $SPID 2>/dev/null
echo done
