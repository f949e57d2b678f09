"""The GPU check: the draft core on a bare CUDA machine (torch and Triton, no vLLM), one
command, one JSON report.

    python -m vllm_sparrow.gpu_check --out gpu-check.json          # 7B shapes, bf16, on CUDA
    python -m vllm_sparrow.gpu_check --shapes tiny --device cpu    # the suite's reduced run

Its parts, each a module here, each judged or measured on its own:
  kernels.py   the compiled window-attention kernel on the [B, 1] layouts serving launches (B = 1,
               64, 256; fresh, full and wrapped rings, padding rows) against its torch reference,
               fp32 to 1e-5 and bf16 against torch's own bf16 error; timed against the torch path
  graphs.py    the decode step replayed from CUDA graphs drafts what the eager drafter drafts at
               K = 8, buckets to 256, requests joining and leaving every step
  memory.py    per configuration (greedy chain in graphs, sampled drafts, tree search): what the
               drafter holds once loaded, vLLM's profile of its largest step, and the peak of real
               steps at that bound (1,023 decodes beside a chunk filling the step; 1,024 decodes)
  costs.py     one more verified token (a 7B-shaped target's verify step, target_step.py, at 1 / 9 /
               17 / 33 rows per request, batch 1-64, 4k and 25k context) and one more draft forward
               (the draft step at depth 1 and 8; a tree-search level at width 1 and 4), relative to
               a one-token step: the numbers depth and tree decisions take (training/depth.py)
  modes.py     tree search, adaptive length, sampled drafts, a reduced vocabulary and the target's
               token I/O, each run once on the device with what must hold of it
The draft core (model, window cache, attention, drafter, graphs) imports nothing from vLLM;
the suite runs this check with vLLM made unimportable. Sizes: shapes.py. Memory (meter.py):
CUDA's allocator, or a size model elsewhere (`--device meta --parts memory` runs 7B shapes at
1,024 requests without allocating them).
"""
