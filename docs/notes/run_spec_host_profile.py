"""Where the host's time goes in a speculative run (issue 21): cProfile over one run of the 7B
shape at batch 1 with the EAGLE-3-layout draft head (k = 4, stated alpha 0.7), after an
untimed one. The GPU waits show as ``Tensor.to`` (the verification's read-back) and
``Tensor.cpu`` (the drafts'); the rest is the host's own work. On the GPU machine:
PYTHONPATH=. python3 docs/notes/run_spec_host_profile.py"""

import cProfile
import io
import pstats

from executor.draft_head import draft_head_of
from executor.paged_draft import PagedDraftModelDrafter
from executor.spec_bench import load_model
from executor.spec_held import HeldWorkload, held_engine, run_cell

work = HeldWorkload(512, 128, 256)
target, _ = load_model("qwen2.5-7b", "bfloat16", "cuda")
head = draft_head_of(target.config, "bfloat16", "cuda", seed=11, draft_vocab=32000)
engine = held_engine(target, 1, work, 4)
drafter = PagedDraftModelDrafter(head, max_seqs=1, max_len=work.max_len(4))
drafter.capture_graphs()
run_cell(engine, work, 1, 4, 0.7, drafter)
pr = cProfile.Profile()
pr.enable()
row = run_cell(engine, work, 1, 4, 0.7, drafter)
pr.disable()
print("steps", row["steps"], "wall", row["wall_s"])
for key in ("tottime", "cumulative"):
    s = io.StringIO()
    pstats.Stats(pr, stream=s).sort_stats(key).print_stats(40)
    print(s.getvalue()[-9000:])
