#!/bin/bash
# W1-48 offline: allocator x huge pages, each a fresh process, alternated, 2 rounds
cd /work/main
for r in 1 2; do
  for v in "tcmalloc 1" "system 1" "tcmalloc 0" "system 0"; do
    set -- $v
    out=/tmp/mx/r${r}_$1_huge$2.json
    /usr/bin/time -f "%e wall %U user %S sys" -o /tmp/mx/r${r}_$1_huge$2.time \
      env TOKENMILL_MALLOC=$1 TOKENMILL_HUGE_PAGES=$2 python -m tokenmill.bench.offline --num-requests 48 \
      --dtype float32 --quantization none --baseline none --json $out > /tmp/mx/r${r}_$1_huge$2.log 2>&1
    echo "$(date +%H:%M:%S) r$r $1 huge=$2 $(python -c "import json; print(json.load(open('$out'))['results'][0])" | head -c 300) $(cat /tmp/mx/r${r}_$1_huge$2.time)"
  done
done
