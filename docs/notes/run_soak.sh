#!/usr/bin/env bash
# Issue 20's soak on the GPU machine (device tool; carry .whl): the 7B shape (random weights)
# served for 10 minutes to 256 closed-loop streams of forced-length completions, a tenth of
# them dropped mid-stream by the client; then the server's gauges and its records.
#   bash docs/notes/run_soak.sh start    # returns at once; the run goes on in the background
#   bash docs/notes/run_soak.sh collect  # waits for it, copies /tmp/soak to $OUT
set -u
if [ "${1:-start}" = start ]; then
  [ -d /tmp/site/fastapi ] || python3 -m pip install -q --no-index --no-deps --no-compile \
    --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  mkdir -p /tmp/soak
  cp -r "$PWD" /tmp/soak/tree  # the run reads its own copy of the code
  setsid nohup bash -c '
    cd /tmp/soak/tree && export PYTHONPATH=/tmp/site:$PWD
    python3 -m executor.serve --model qwen2.5-7b --num-blocks 20000 --port 8001 \
      --records /tmp/soak/records.npz > /tmp/soak/server.log 2>&1 & srv=$!
    for _ in $(seq 1 300); do python3 -c "import urllib.request as u; u.urlopen(\"http://127.0.0.1:8001/health\", timeout=1)" 2>/dev/null && break; sleep 1; done
    python3 -m executor.serve.soak --url http://127.0.0.1:8001 --streams 256 --duration ${SOAK_S:-600} \
      --json-out /tmp/soak/soak.json > /tmp/soak/soak.log 2>&1
    echo "soak rc $?" >> /tmp/soak/soak.log
    kill -INT $srv; wait $srv; echo "server rc $?" >> /tmp/soak/soak.log
    touch /tmp/soak/done' > /tmp/soak/nohup.log 2>&1 < /dev/null &
  echo started
else
  while [ ! -e /tmp/soak/done ]; do sleep 5; done
  cat /tmp/soak/soak.log; tail -3 /tmp/soak/server.log
  cp /tmp/soak/soak.json /tmp/soak/soak.log /tmp/soak/records.npz "$OUT"/
  tail -200 /tmp/soak/server.log > "$OUT/soak_server_tail.log"
fi
