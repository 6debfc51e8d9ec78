#!/bin/bash
# Issue 21 on the GPU: the Qwen2.5-7B shape (seeded random weights, bf16) speculating under
# STATED acceptance (geometric, seed 0: the simulator's model and draws; the target's random
# weights accept nothing real), drafting and verification costs real and measured, at a held
# batch size: experiments.spec_crossover's workload (2B+6 requests, prompt 512, outputs
# 128..383, all at t = 0, max_num_seqs = B: continuous refill), plain = the default engine
# (pipelined, graphs) at the same batch. One GPU call, no wheels (torch, triton, numpy):
#   bash docs/notes/run_spec7b.sh
# a) drafts from a Qwen2.5-0.5B-shape draft model (random weights, its own paged KV cache,
#    batched graph-replayed decode steps: executor.paged_draft), alpha 0.7, k 1,2,4,8, batch
#    1..64; then the draft cost per position against the 0.5B engine's decode step, paged and
#    dense (executor.draft_model, batch <= 16) drafters, at batch 1, 16, 64
#                                                              -> $OUT/spec7b_draft.{json,log}
# b) n-gram drafts (prompt lookup padded to k: host work only), alpha 0.5,0.7,0.9, k 4,
#    batch 1,4,16,64                                           -> $OUT/spec7b_ngram.{json,log}
# Cells not started by BUDGET_A / BUDGET_B s are skipped (listed so in the table and JSON; the
# JSON is rewritten after every cell); each part is killed at LIMIT_A / LIMIT_B s (330 + 170:
# within 9 minutes; expected ~4.5 + ~1.5 minutes). Prints part b's table, then part a's last.
# Each cell is printed beside the simulator's (results/spec_crossover/sim.json: drafter
# draft_0.5b / ngram, same alpha, k and batch): its speedup ("sim x") and accepted drafts per
# draft ("sim acc": the same draws and plans, so equal to the engine's), and the simulated
# crossovers over the same batches. Fold in: copy the JSON files to results/spec_bench/.
set -u
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.used --format=csv,noheader
t=$(date +%s)
timeout ${LIMIT_A:-330} python3 -m executor.spec_bench --model qwen2.5-7b --dtype bfloat16 \
  --drafter draft:qwen2.5-0.5b --acceptance 0.7 --k 1,2,4,8 --batch 1,2,4,8,16,32,64 \
  --budget-s ${BUDGET_A:-230} --draft-cost 1,16,64 --compare results/spec_crossover/sim.json \
  --json-out "$OUT/spec7b_draft.json" > "$OUT/spec7b_draft.log" 2>&1
echo "a (draft model): rc $? in $(( $(date +%s) - t )) s"
t=$(date +%s)
timeout ${LIMIT_B:-170} python3 -m executor.spec_bench --model qwen2.5-7b --dtype bfloat16 \
  --drafter ngram --acceptance 0.5,0.7,0.9 --k 4 --batch 1,4,16,64 \
  --budget-s ${BUDGET_B:-110} --compare results/spec_crossover/sim.json \
  --json-out "$OUT/spec7b_ngram.json" > "$OUT/spec7b_ngram.log" 2>&1
echo "b (n-gram): rc $? in $(( $(date +%s) - t )) s"
echo "== b: n-gram =="; tail -n 22 "$OUT/spec7b_ngram.log"
echo "== a: draft model =="; grep "^draft cost" "$OUT/spec7b_draft.log"
tail -n 41 "$OUT/spec7b_draft.log"
