#!/bin/bash
# W1-48, ours only, 2 rounds in one process (round 2: every KV page already written), by huge-page policy
cd /work/main
for c in 1 2; do
  for h in all 1 0; do
    out=/tmp/mx/kv_c${c}_huge$h.json
    /usr/bin/time -f "%e wall %U user %S sys" -o /tmp/mx/kv_c${c}_huge$h.time env TOKENMILL_HUGE_PAGES=$h \
      python benchmarks/compare_vllm.py --num-requests 48 --dtype float32 --quantization none --rounds 2 --json $out > /tmp/mx/kv_c${c}_huge$h.log 2>&1
    echo "$(date +%H:%M:%S) c$c huge=$h $(python -c "
import json; r = json.load(open('$out'))
print('start %.1f s' % r['tokenmill']['engine_start_s'], [round(x['tokenmill']['output_tokens_per_s'], 1) for x in r['runs']])" 2>&1 | tail -1) $(cat /tmp/mx/kv_c${c}_huge$h.time)"
  done
done
