#!/bin/bash
# Policies at their rates on the 7B engine, seeds 0-2: bash docs/notes/run_rate90.sh <dir>...
# Inputs: python -m experiments.headline_engine export --rate R --policies P --out gpu_inputs/rate90/<dir>.
# Unpack eng.tar.gz and install eng/<dir>/seed<s>/headline beside the export's manifest.json.
set -e
mkdir -p /tmp/eng
nvidia-smi --query-gpu=name,memory.used --format=csv,noheader
for D in "$@"; do
  for s in 0 1 2; do
    t=$(date +%s)
    python -m experiments.engine_replay --manifest gpu_inputs/rate90/$D/seed$s/manifest.json \
      --out /tmp/eng/$D/seed$s > /tmp/eng/$D.seed$s.log 2>&1 || { tail -30 /tmp/eng/$D.seed$s.log; exit 1; }
    echo "$D seed $s: $(( $(date +%s) - t )) s; $(tail -1 /tmp/eng/$D.seed$s.log)"
  done
done
tar czf $OUT/eng.tar.gz -C /tmp eng  # one file back: the device returns at most 8
