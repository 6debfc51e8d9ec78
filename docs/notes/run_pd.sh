#!/bin/bash
# The co-located P/D engine runs beside a mixed pair on the same requests (experiments/pd_fidelity.py):
# python -m experiments.pd_fidelity export; then on the device: bash docs/notes/run_pd.sh
nvidia-smi --query-gpu=name,memory.used --format=csv,noheader
for side in pd mixed; do
  timeout ${LIMIT:-270} python -m experiments.cluster_engine_replay \
    --manifest gpu_inputs/pd/$side/cluster_manifest.json --out $OUT/engine/$side 2>&1 | grep -v Warning | tail -8
done
tar -C $OUT -czf $OUT/pd_engine.tgz engine && rm -rf $OUT/engine
