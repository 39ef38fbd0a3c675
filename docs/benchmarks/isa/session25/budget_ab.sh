# tokenmill serve, chat at 1 and 2 req/s, 60 requests: budget 1024 (default) vs 2048, alternated
cd /work/main
M=/root/.cache/tokenmill/gguf/SmolLM2-135M-Instruct.Q4_1-bec1d71155329fe0
run() {  # $1 label, $2 extra flags
  python -m tokenmill.cli serve --model $M --port 8011 --dtype bfloat16 --max-model-len 8192 --disable-log-stats --quantization none $2 > /tmp/s25/budget_$1.log 2>&1 &
  pid=$!
  for i in $(seq 60); do curl -sf http://127.0.0.1:8011/v1/models >/dev/null && break; sleep 2; done
  python -m tokenmill.bench.serve serve --base-url http://127.0.0.1:8011 --workload chat --sweep 1,2 --num-requests 60 --tokenizer $M --seed 0 --out /tmp/s25/budget_ab/$1 --disable-tqdm > /dev/null 2>&1
  kill $pid; wait $pid
}
run b1024_r1 ""
run b2048_r1 "--max-num-batched-tokens 2048"
run b1024_r2 ""
run b2048_r2 "--max-num-batched-tokens 2048"
