"""The glue to vLLM's V1 model runner (vLLM 0.32, 0.33), beside the V2 runner's glue (0.34).

These releases have no registry of speculative methods, so "sparrow" enters vLLM through
declared, version-checked patches (patches.py joins their rows into one table and applies it):

  method_patches.py  the method's patches: "sparrow" in vLLM's SpeculativeConfig, the proposer
                     the runner builds for it, the release of ended requests, its checkpoints
  proposer.py        SparrowProposer, the EagleProposer the runner drafts with: each step as a
                     StepBatch for the drafter (serving_draft.py loads it, as on the V2 runner)
  vllm_reads.py      the V1 internals the glue reads without patching them
  vllm_fixes.py      general fixes of vLLM 0.32 met on the way (each can be turned off)
"""
