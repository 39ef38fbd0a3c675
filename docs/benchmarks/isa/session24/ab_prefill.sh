# alternate A (/tmp/wtA) and B (/work/main) processes, R rounds
for r in $(seq ${R:-3}); do
  for w in ${WS:-/tmp/wtA /work/main}; do echo "== $w"; (cd /tmp && PYTHONPATH=$w python /tmp/s24/pre.py 2>&1 | grep -v INFO); done
done
