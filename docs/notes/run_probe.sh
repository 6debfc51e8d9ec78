#!/bin/bash
# The speed probe's repeatability (issue 23, step 3), one GPU call: per model, the lowo
# manifest's probe (96 requests at t = 0: the same plans on every run) replayed PROBES times
# back to back in one engine process (experiments.engine_replay), nothing else. Carry
# gpu_inputs/lowo (python -m experiments.lowo_workloads export). No wheels.
#   bash docs/notes/run_probe.sh [MODEL...]   (default: qwen2.5-7b qwen2.5-0.5b)
# Writes $OUT/probe_eng.tar.gz (engine_<model>/probe_<i>/fcfs/{records.npz,meta.json}) and
# prints, per model and run, the mean decode-only and mixed step ms and the ratio of each run's
# mean step to the median run's: the first run after graph capture against the others.
set -u
export PYTHONUNBUFFERED=1
mkdir -p /tmp/probe
nvidia-smi --query-gpu=name,memory.used --format=csv,noheader
for M in ${@:-qwen2.5-7b qwen2.5-0.5b}; do
  python3 - "$M" "${PROBES:-5}" <<'PY'
import json, sys
m, n = sys.argv[1], int(sys.argv[2])
path = f"gpu_inputs/lowo/{m}/manifest.json"
man = json.load(open(path))
probe = next(c for c in man["cases"] if c["name"] == "probe_0")
man["cases"] = [dict(probe, name=f"probe_{i}") for i in range(n)]
json.dump(man, open(f"gpu_inputs/lowo/{m}/probe_manifest.json", "w"))
PY
  t=$(date +%s)
  timeout ${LIMIT:-200} python3 -m experiments.engine_replay \
    --manifest gpu_inputs/lowo/$M/probe_manifest.json --out /tmp/probe/engine_$M \
    > /tmp/probe/engine_$M.log 2>&1
  echo "$M: rc $? in $(( $(date +%s) - t )) s"
done
tar czf $OUT/probe_eng.tar.gz -C /tmp/probe .
python3 - <<'EOF2'
import glob, os
import numpy as np
from horizon.metrics.records import RunRecords
print("| model | run | steps | decode-only ms | mixed ms | mean step / median run's |")
print("|---|---|---|---|---|---|")
for d in sorted(glob.glob("/tmp/probe/engine_*")):
    runs = sorted(glob.glob(f"{d}/probe_*/fcfs/records.npz"), key=lambda f: int(f.split("probe_")[1].split("/")[0]))
    rows = []
    for f in runs:
        r = RunRecords.load_npz(f)
        dur, mixed = r.step_durations(), r.prefill_tokens > 0
        rows.append((f.split("/")[-3], len(dur), 1e3 * dur[~mixed].mean(), 1e3 * dur[mixed].mean(), dur.mean()))
    med = float(np.median([x[4] for x in rows])) if rows else float("nan")
    for name, n, dec, mix, mean in rows:
        print(f"| {os.path.basename(d)[7:]} | {name} | {n} | {dec:.3f} | {mix:.3f} | {mean / med:.4f} |")
EOF2
