# tokenmill serve, one workload at 1 and 2 req/s, 60 requests, two server flag sets alternated twice:
#   bash serve_ab.sh WORKLOAD OUT LABEL_A "FLAGS_A" LABEL_B "FLAGS_B"
# session 27 ran it as
#   bash serve_ab.sh chat budget_rule_ab b1024 "" b2048 "--max-num-batched-tokens 2048"
#   bash serve_ab.sh long-short-mix mix_rule_ab off "--no-one-prompt-end-per-step" on ""
W=$1; OUT=$2
M=/root/.cache/tokenmill/gguf/SmolLM2-135M-Instruct.Q4_1-bec1d71155329fe0
run() {  # $1 label, $2 extra flags
  python -m tokenmill.cli serve --model $M --port 8011 --dtype bfloat16 --max-model-len 8192 --disable-log-stats \
    --quantization none $2 > /tmp/serve_ab_$1.log 2>&1 &
  pid=$!
  for i in $(seq 60); do curl -sf http://127.0.0.1:8011/v1/models >/dev/null && break; sleep 2; done
  python -m tokenmill.bench.serve serve --base-url http://127.0.0.1:8011 --workload $W --sweep 1,2 --num-requests 60 \
    --tokenizer $M --seed 0 --out $OUT/$1 --disable-tqdm > /dev/null 2>&1
  kill $pid; wait $pid
}
for r in 1 2; do run $3_r$r "$4"; run $5_r$r "$6"; done
