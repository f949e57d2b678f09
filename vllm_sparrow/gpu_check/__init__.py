"""The GPU check: the draft core on a bare CUDA machine (torch and Triton, no vLLM), one
command, one JSON report.

    python -m vllm_sparrow.gpu_check --out gpu-check.json          # 7B shapes, bf16, on CUDA
    python -m vllm_sparrow.gpu_check --shapes tiny --device cpu    # the suite's reduced run

Its parts, each a module here, each judged or measured on its own:
  kernels.py   the compiled window-attention kernel against its torch reference (7B heads, bf16)
  graphs.py    the decode step replayed from CUDA graphs drafts what the eager drafter drafts
               (batches 1-64, prompts joining, requests leaving)
  memory.py    the draft's resident bytes at vLLM's GPU defaults, vLLM's profile of it, and the
               peak of mixed steps (prompt chunks beside hundreds of decodes)
  timing.py    a draft step against a 7B-shaped target's verify step (target_step.py) at 4k and
               25k context, batch 1 / 16 / 64
The draft core (model, window cache, attention, drafter, graphs) imports nothing from vLLM;
the suite runs this check with vLLM made unimportable. Sizes: shapes.py.
"""
