#!/bin/bash
# Issue 21 on the GPU: verification steps as expanded decode steps (EngineConfig.verify_as_decode,
# on by default) against the mixed path (ragged prefill kernel, mixed-step graphs), same code,
# same process kind, one window. The Qwen2.5-7B shape (seeded random weights, bf16) under STATED
# acceptance (geometric alpha 0.7, seed 0: the simulator's draws, so both modes run the same
# plans and steps), at a held batch (experiments.spec_crossover's workload: 2B+6 requests,
# prompt 512, outputs 128..383, max_num_seqs = B); plain = the default engine (pipelined, decode
# graphs) at the same batch, run in each part (its repeat is the noise floor). One GPU call, no
# wheels (torch, triton, numpy):
#   bash docs/notes/run_verify_ab.sh
# a) n-gram drafts (free: host work only, padded to k), k 4, batch 1,4,16,64, path ON
#                                                          -> $OUT/verify_ab_on.{json,log}
# b) the same, path OFF (--verify-as-decode off)           -> $OUT/verify_ab_off.{json,log}
# c) a Qwen2.5-0.5B-shape draft model (random weights, paged, graph-replayed decode steps),
#    k 4, batch 1,4, path ON                               -> $OUT/verify_ab_draft.{json,log}
# Each part is killed at LIMIT_A / LIMIT_B / LIMIT_C s (120 + 120 + 100: within 6 minutes;
# expected ~1 minute each); cells not started by BUDGET_* s are skipped (listed so; the JSON is
# rewritten after every cell). Every row counts its verification steps by path (verify_steps:
# decode = expanded, mixed = the steps that carried prefill chunks, or all of them when off).
# Prints each part's rc, then a table last: per batch, plain and speculative tok/s, x plain and
# wall ms per step with the path on and off, on/off speedup, and the draft-model cells.
# Fold in: copy the JSON files to results/spec_bench/. Checked on the CPU with
#   OUT=/tmp/ab MODEL=tiny DTYPE=float32 DRAFT=tiny BATCHES=1,2 DRAFT_BATCHES=1 \
#   EXTRA="--device cpu --prompt-len 20 --out-base 6 --out-span 6" bash docs/notes/run_verify_ab.sh
set -u
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.used --format=csv,noheader
COMMON="--model ${MODEL:-qwen2.5-7b} --dtype ${DTYPE:-bfloat16} --acceptance 0.7 --k 4 ${EXTRA:-}"
BATCHES=${BATCHES:-1,4,16,64}
t=$(date +%s)
timeout ${LIMIT_A:-120} python3 -m executor.spec_bench $COMMON --drafter ngram \
  --batch $BATCHES --budget-s ${BUDGET_A:-90} --verify-as-decode on \
  --json-out "$OUT/verify_ab_on.json" > "$OUT/verify_ab_on.log" 2>&1
echo "a (n-gram, path on): rc $? in $(( $(date +%s) - t )) s"
t=$(date +%s)
timeout ${LIMIT_B:-120} python3 -m executor.spec_bench $COMMON --drafter ngram \
  --batch $BATCHES --budget-s ${BUDGET_B:-90} --verify-as-decode off \
  --json-out "$OUT/verify_ab_off.json" > "$OUT/verify_ab_off.log" 2>&1
echo "b (n-gram, path off): rc $? in $(( $(date +%s) - t )) s"
t=$(date +%s)
timeout ${LIMIT_C:-100} python3 -m executor.spec_bench $COMMON --drafter draft:${DRAFT:-qwen2.5-0.5b} \
  --batch ${DRAFT_BATCHES:-1,4} --budget-s ${BUDGET_C:-70} --verify-as-decode on \
  --json-out "$OUT/verify_ab_draft.json" > "$OUT/verify_ab_draft.log" 2>&1
echo "c (draft model, path on): rc $? in $(( $(date +%s) - t )) s"
for f in on off draft; do echo "== $f: last lines =="; tail -n 4 "$OUT/verify_ab_$f.log"; done
python3 - "$OUT" <<'EOF'
import json, os, sys

def rows(name):
    path = os.path.join(sys.argv[1], f"verify_ab_{name}.json")
    if not os.path.exists(path):
        return {}, "missing"
    with open(path) as f:
        res = json.load(f)
    done = {(r["batch"], r["k"]): r for r in res["rows"] if not r.get("skipped")}
    return done, "partial" if res.get("partial") else "complete"

def cell(r):
    if r is None:
        return f"{'-':>9} {'-':>6} {'-':>8}"
    return f"{r['tok_s']:>9,.0f} {r['speedup']:>6.2f} {1e3 * r['wall_s'] / r['steps']:>8.2f}"

on, s_on = rows("on")
off, s_off = rows("off")
draft, s_draft = rows("draft")
shape = f"{os.environ.get('MODEL', 'qwen2.5-7b')} {os.environ.get('DTYPE', 'bfloat16')}"
print(f"\nverify-as-decode A/B: {shape}, random weights, stated acceptance alpha=0.7 "
      f"(geometric, seed 0), k 4, held batch; n-gram drafts (on: {s_on}, off: {s_off})")
print(f"{'batch':>5} {'plain on':>9} {'plain off':>9} | {'spec ON':>9} {'x':>6} {'ms/step':>8} "
      f"| {'spec OFF':>9} {'x':>6} {'ms/step':>8} | {'on/off':>6} {'verify dec/mix':>14}")
for b in sorted({b for b, _ in on} | {b for b, _ in off}):
    p_on, p_off = on.get((b, 0)), off.get((b, 0))
    a, z = on.get((b, 4)), off.get((b, 4))
    ratio = f"{a['tok_s'] / z['tok_s']:>6.2f}" if a and z else f"{'-':>6}"
    paths = "-" if a is None else "{decode}/{mixed}".format(**a["verify_steps"])
    pl = lambda r: f"{r['tok_s']:>9,.0f}" if r else f"{'-':>9}"
    print(f"{b:>5} {pl(p_on)} {pl(p_off)} | {cell(a)} | {cell(z)} | {ratio} {paths:>14}")
drafter = os.environ.get("DRAFT", "qwen2.5-0.5b")
print(f"\ndraft model {drafter} (random weights), path on ({s_draft}); target 2x at batch 1")
print(f"{'batch':>5} {'plain':>9} | {'spec':>9} {'x':>6} {'ms/step':>8} | {'draft s':>7} "
      f"{'verify dec/mix':>14}")
for b in sorted({b for b, _ in draft}):
    p, a = draft.get((b, 0)), draft.get((b, 4))
    plain = f"{p['tok_s']:>9,.0f}" if p else f"{'-':>9}"
    ds = "-" if a is None or a.get("draft_s") is None else f"{a['draft_s']:.2f}"
    paths = "-" if a is None else "{decode}/{mixed}".format(**a["verify_steps"])
    print(f"{b:>5} {plain} | {cell(a)} | {ds:>7} {paths:>14}")
EOF
