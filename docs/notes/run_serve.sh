#!/usr/bin/env bash
# The serving measurements of issue 20 on the GPU machine (device tool; carry .whl and
# gpu_inputs/serve). Part "a": the HTTP path against the offline engine (executor.serve.bench,
# the 7B shape, forced lengths), then GuideLLM at three Poisson rates against the 7B shape
# serving ShareGPT text (Qwen's BPE, forced lengths) with the server's records.
#   bash docs/notes/run_serve.sh a        -> $OUT/serve_bench.json, $OUT/loadgen_7b.tar.gz
set -u
part=${1:-a}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 GUIDELLM__LOGGING__DISABLED=1
python3 -c 'import torch, triton, fastapi, guidellm; print(torch.__version__, triton.__version__, torch.cuda.get_device_name(), "guidellm", guidellm.__version__ if hasattr(guidellm, "__version__") else "?")'
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader

wait_up() {  # port
  for _ in $(seq 1 300); do
    python3 - "$1" <<'PY' && return 0
import sys, urllib.request
try:
    urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/health", timeout=1)
except Exception:
    sys.exit(1)
PY
    sleep 1
  done
  return 1
}

loadgen() {  # name port rates... : GuideLLM, one Poisson run per rate
  local name=$1 port=$2; shift 2
  mkdir -p "$OUT/$name"
  for rate in "$@"; do
    timeout 240 python3 -m guidellm run \
      --backend kind=openai_http,target=http://127.0.0.1:$port \
      --profile kind=poisson,rate=$rate --seed kind=static,value=0 \
      --constraint kind=max_requests,count=${LOADGEN_REQUESTS:-250} \
      --data kind=json_file,path=gpu_inputs/serve/sharegpt.jsonl \
      --output kind=json,path=$OUT/$name/guidellm_rate$rate.json \
      --disable-console-interactive > "$OUT/$name/guidellm_rate$rate.log" 2>&1
    echo "guidellm $name rate $rate rc $?"; tail -4 "$OUT/$name/guidellm_rate$rate.log"
  done
}

if [ "$part" = a ]; then
  timeout 300 python3 -m executor.serve.bench --model qwen2.5-7b --concurrency 64,256 \
    --requests 256 --prompt-len 256 --output-len 128 --low-load-requests 32 \
    --low-load-output 16 --json-out "$OUT/serve_bench.json" > "$OUT/serve_bench.log" 2>&1; echo "bench rc $?"; tail -12 "$OUT/serve_bench.log"
  python3 -m executor.serve --model qwen2.5-7b --tokenizer qwen --num-blocks 20000 \
    --max-model-len 4096 --port 8000 --records "$OUT/loadgen_7b/records.npz" \
    > "$OUT/server_7b.log" 2>&1 &
  srv=$!
  mkdir -p "$OUT/loadgen_7b"
  wait_up 8000 || { tail -30 "$OUT/server_7b.log"; exit 1; }
  loadgen loadgen_7b 8000 5 10 18
  kill -INT $srv; wait $srv; echo "server rc $?"; tail -3 "$OUT/server_7b.log"
  cp "$OUT/server_7b.log" "$OUT/loadgen_7b/"
  tar -czf "$OUT/loadgen_7b.tar.gz" -C "$OUT" loadgen_7b && rm -rf "$OUT/loadgen_7b"
fi
ls -la "$OUT"
