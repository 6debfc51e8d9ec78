#!/bin/bash
# Issue 21 on the GPU: the Qwen2.5-7B shape (seeded random weights, bf16) drafting with a draft
# head in EAGLE-3's layout on its width (executor.draft_head: one decoder layer, 32,000-token
# draft vocabulary, random weights), under STATED acceptance (geometric, seed 0: the
# simulator's draws), beside the 0.5B-shape draft model in the same lease. One GPU call, no
# wheels (torch, triton, numpy):
#   bash docs/notes/run_eagle3.sh
# 0) check: the head's fused kernels, with graphs captured first or on first use and without
#    graphs (fp32), propose what its reference ops propose
# a) eagle3: alpha 0.7, k 1,2,4,8, batch 1..64, draft cost at batch 1,16,64 (k 8)
#                                                      -> $OUT/spec7b_eagle3.{json,log}
# b) the 0.5B draft model, alpha 0.7, k 4, batch 1 (the same-lease baseline of 1.41x)
#                                                      -> $OUT/spec7b_draft05_k4.{json,log}
# c) eagle3 draft cost at k 1 and 2 (batch 1, 16, 64): the fixed part per proposal
#                                                      -> $OUT/eagle3_cost_k{1,2}.json
# Fold in: copy the JSON files to results/spec_bench/.
set -u
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.used --format=csv,noheader
t=$(date +%s)
timeout 60 python3 - <<'EOF'
import numpy as np, torch
from executor.draft_head import draft_head_of
from executor.model import ModelConfig
from executor.paged_draft import PagedDraftModelDrafter
head = draft_head_of(ModelConfig.for_preset("qwen2.5-7b"), "float32", "cuda", seed=11)
for eager_capture in (False, True):
    rng = np.random.default_rng(0)
    hs = [rng.integers(0, 152064, n) for n in (600, 40, 300, 9)]
    ref = PagedDraftModelDrafter(head, max_seqs=4, max_len=1024, backend="torch", cuda_graphs=False)
    fus = PagedDraftModelDrafter(head, max_seqs=4, max_len=1024)
    nog = PagedDraftModelDrafter(head, max_seqs=4, max_len=1024, cuda_graphs=False)
    if eager_capture:
        fus.capture_graphs()
    same = same_nog = total = 0
    for rnd in range(4):
        a = ref.propose_batch(hs, [4] * 4, [0, 1, 2, 3])
        b = fus.propose_batch(hs, [4] * 4, [0, 1, 2, 3])
        c = nog.propose_batch(hs, [4] * 4, [0, 1, 2, 3])
        same += sum(int((x == y).sum()) for x, y in zip(a, b)); total += 16
        same_nog += sum(int((x == y).sum()) for x, y in zip(a, c))
        hs = [np.concatenate([h, x[: rnd % 5], [int(rng.integers(0, 152064))]]) for h, x in zip(hs, a)]
    print(f"check ({'graphs captured first' if eager_capture else 'graphs captured on first use'}): "
          f"drafts equal to the reference ops' with graphs {same}/{total}, fused without graphs {same_nog}/{total}")
EOF
echo "0 (check): rc $? in $(( $(date +%s) - t )) s"
t=$(date +%s)
timeout 280 python3 -m executor.spec_bench --model qwen2.5-7b --dtype bfloat16 \
  --drafter eagle3 --acceptance 0.7 --k 1,2,4,8 --batch 1,2,4,8,16,32,64 \
  --budget-s 200 --draft-cost 1,16,64 \
  --json-out "$OUT/spec7b_eagle3.json" > "$OUT/spec7b_eagle3.log" 2>&1
echo "a (eagle3): rc $? in $(( $(date +%s) - t )) s"
t=$(date +%s)
timeout 75 python3 -m executor.spec_bench --model qwen2.5-7b --dtype bfloat16 \
  --drafter draft:qwen2.5-0.5b --acceptance 0.7 --k 4 --batch 1 \
  --json-out "$OUT/spec7b_draft05_k4.json" > "$OUT/spec7b_draft05_k4.log" 2>&1
echo "b (0.5B draft, k 4, batch 1): rc $? in $(( $(date +%s) - t )) s"
for k in 1 2; do
  t=$(date +%s)
  timeout 55 python3 -m executor.spec_bench --model qwen2.5-7b --dtype bfloat16 \
    --drafter eagle3 --acceptance 0.7 --k $k --batch 1 --draft-cost 1,16,64 \
    --json-out "$OUT/eagle3_cost_k$k.json" > "$OUT/eagle3_cost_k$k.log" 2>&1
  echo "c (eagle3 cost, k $k): rc $? in $(( $(date +%s) - t )) s"
done
grep -h "^draft cost" "$OUT"/eagle3_cost_k*.log
echo "== b: 0.5B draft model =="; tail -n 4 "$OUT/spec7b_draft05_k4.log"
echo "== a: eagle3 =="; grep "^draft cost" "$OUT/spec7b_eagle3.log"
tail -n 36 "$OUT/spec7b_eagle3.log"
