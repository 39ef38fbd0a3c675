#!/bin/bash
PORT=$1; shift
start=$(date +%s.%N)
tokenmill serve --port $PORT "$@" > /tmp/srv_$PORT.log 2>&1 &
PID=$!
until curl -sf http://127.0.0.1:$PORT/health >/dev/null; do sleep 0.2; done
ready=$(date +%s.%N)
kill -INT $PID; wait $PID
echo "ready after $(echo "$ready - $start" | bc) s"
grep -E "KV cache mapped|huge pages advised|weight arena" /tmp/srv_$PORT.log | cut -c1-200
