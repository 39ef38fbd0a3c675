set -e
cd /work/main
python /tmp/r21/probe/sampler.py /tmp/r21/probe/samples.jsonl & SAMPLER=$!
python -m tokenmill.cli serve --model /root/.cache/tokenmill/gguf/SmolLM2-135M-Instruct.Q4_1-56e59c5fbca57258 --port 8011 --dtype float32 --max-model-len 2048 --disable-log-stats --quantization none > /tmp/r21/probe/tokenmill.log 2>&1 & SERVER=$!
for i in $(seq 120); do curl -sf -o /dev/null http://127.0.0.1:8011/health && break; sleep 1; done
python -m tokenmill.bench.serve serve --base-url http://127.0.0.1:8011 --workload chat --sweep 1,2,4 --num-requests 30 --tokenizer /root/.cache/tokenmill/gguf/SmolLM2-135M-Instruct.Q4_1-56e59c5fbca57258 --seed 0 --out /tmp/r21/probe/chat --disable-tqdm > /tmp/r21/probe/bench.log 2>&1 || true
kill $SERVER; wait $SERVER || true
kill $SAMPLER || true
