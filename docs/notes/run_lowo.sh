#!/bin/bash
# Engine runs of the three workloads leave-one-workload-out adds (issue 23), one GPU call:
#   bash docs/notes/run_lowo.sh [MODEL...]      (default: qwen2.5-7b qwen2.5-0.5b, in that order)
# Inputs: python -m experiments.lowo_workloads export (gpu_inputs/lowo/<model>/; carry
# gpu_inputs/lowo). No wheels: the engine's replay needs only torch, triton and numpy.
# Per model: the speed probe, the anchor case, 6 cases x fcfs/horizon, the probe again
# (experiments/lowo_workloads.py), each model's replay stopped after LIMIT s (default 265: both within 9 minutes).
# Writes $OUT/lowo_eng.tar.gz (engine_<model>/<case>/<policy>/{records.npz,meta.json} and
# engine_<model>.log) and prints a table last. Fold it in, here:
#   tar xzf <files_at>/lowo_eng.tar.gz -C results/lowo && python -m experiments.lowo
set -u
mkdir -p /tmp/lowo
nvidia-smi --query-gpu=name,memory.used --format=csv,noheader
export PYTHONUNBUFFERED=1
for M in ${@:-qwen2.5-7b qwen2.5-0.5b}; do
  t=$(date +%s)
  timeout ${LIMIT:-265} python3 -m experiments.engine_replay \
    --manifest gpu_inputs/lowo/$M/manifest.json --out /tmp/lowo/engine_$M \
    > /tmp/lowo/engine_$M.log 2>&1
  echo "$M: rc $? in $(( $(date +%s) - t )) s"
done
tar czf $OUT/lowo_eng.tar.gz -C /tmp/lowo .  # one file back, whatever finished in time
python3 - <<'EOF'
import glob, json, os
from horizon.metrics.records import RunRecords
print("| run | finished | steps | decode-only ms | mixed ms | wall s |")
print("|---|---|---|---|---|---|")
for f in sorted(glob.glob("/tmp/lowo/engine_*/*/*/records.npz")):
    run = os.path.relpath(os.path.dirname(f), "/tmp/lowo")
    r = RunRecords.load_npz(f)
    dur, mixed = r.step_durations(), r.prefill_tokens > 0
    fin = int((r.status == 0).sum())
    wall = json.load(open(os.path.join(os.path.dirname(f), "meta.json")))["wall_s"]
    dec = 1e3 * dur[~mixed].mean() if (~mixed).any() else float("nan")
    mix = 1e3 * dur[mixed].mean() if mixed.any() else float("nan")
    print(f"| {run} | {fin}/{r.num_requests} | {len(dur)} | {dec:.3f} | {mix:.3f} | {wall:.1f} |")
EOF
