"""Reference draft and verify costs of a GPU, which `sparrow tune` sets beside this machine's: what
it would choose there, for a reader on a CPU (or on another GPU) to compare.

Not measured by this project (no GPU run yet; the GPU check's costs part measures both on the
machine it runs on: docs/verified-where.md). Both are relative to a one-token decode step of the
target at that batch size, for a 7B-class target at ~25k tokens of context:

  v  one more verified token: a 27B target's measured verify steps on one MI355X (tree-verify
     backend): 16 verified tokens cost 1.29 / 1.62 / 2.94 one-token forwards at batch 1 / 8 / 32,
     so v = (ratio - 1) / 15 (shared/notes/tree-drafts.md: at 8 and 32 tokens the per-token cost
     is within a third of these at batch 8 and 32, larger at batch 1 for 8 tokens);
  d  one more draft forward and its LM head: a one-layer 7B-wide draft with the 152k head reads
     ~1.6 GB (0.42 ms at 3.8 TB/s), against a one-token 7B step that reads ~15 GB of weights and
     1.4 GB of KV per request at 25k (bytes, H200: shared/notes/drafter-cost.md): 0.10 at batch
     1, 0.06 at 8, 0.026 at 32.
"""

from __future__ import annotations

NAME = "reference GPU (7B target, ~25k context; verify: a 27B target's measured ratios, draft: estimated from bytes)"

# batch size -> (draft forward cost d, verify token cost v), relative to a one-token step
COSTS: dict[int, tuple[float, float]] = {
    1: (0.10, 0.29 / 15),
    8: (0.06, 0.62 / 15),
    32: (0.026, 1.94 / 15),
}
