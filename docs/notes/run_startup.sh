#!/bin/bash
# Cold start phase by phase (0.5B and 7B shapes) and KV block copies between two replica
# processes on one GPU: bash docs/notes/run_startup.sh  (on the device; writes $OUT/*.json)
nvidia-smi --query-gpu=name,memory.used --format=csv,noheader
df -h . /tmp | tail -2
mkdir -p .cold_tmp
timeout ${COLD_LIMIT:-400} python -m executor.cold_start --device cuda \
  --shapes qwen2.5-0.5b,qwen2.5-7b --repeats ${REPEATS:-3} --tmp-dir .cold_tmp \
  --out $OUT/cold_start.json 2>&1 | tail -25
rm -rf .cold_tmp
timeout ${KV_LIMIT:-150} python -m executor.kv_transfer_bench --device cuda \
  --shape qwen2.5-0.5b,qwen2.5-7b --out $OUT/kv_transfer.json 2>&1 | tail -30
