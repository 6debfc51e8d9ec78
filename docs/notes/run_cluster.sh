#!/bin/bash
# Co-located engine replicas for the cluster fidelity comparison: bash docs/notes/run_cluster.sh N [CASE...]
# Inputs: python -m experiments.cluster_fidelity export [--alone] (gpu_inputs/cluster/n<N>/;
# --alone adds n1: one replica alone at the co-located cases' loads per replica, N=1).
# Packs /tmp/ceng into one file (the device returns at most 8), whatever finished in time.
N=$1; shift
mkdir -p /tmp/ceng
nvidia-smi --query-gpu=name,memory.used --format=csv,noheader
CASES=""; for c in "$@"; do CASES="$CASES --case $c"; done
timeout ${LIMIT:-530} python -m experiments.cluster_engine_replay \
  --manifest gpu_inputs/cluster/n$N/cluster_manifest.json --out /tmp/ceng/n$N $CASES 2>&1 | tail -40
tar czf $OUT/ceng_n$N.tar.gz -C /tmp ceng
