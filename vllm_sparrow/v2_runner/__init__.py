"""The glue to vLLM's Model Runner V2 (vLLM 0.34), beside the V1 runner's glue (0.32, 0.33).

0.34 has a registry of speculative methods: the plugin registers "sparrow" through it
(method.py), and vLLM builds the speculator the registered config names. Nothing of vLLM is
patched for the method on this runner.

  method.py      the registered SpeculatorConfig: validates the draft against the target, fills
                 its depth in, takes Sparrow's options from speculator_options; light (every vLLM
                 process imports it)
  speculator.py  the speculator vLLM builds in its workers: the drafter (serving_draft.py, as on
                 the V1 runner) behind 0.34's lifecycle hooks and propose()
  step_inputs.py one runner step as a StepBatch, read from the runner's host arrays and the
                 step's device tensors without reading the device back
  vllm_reads.py  every internal of vLLM 0.34 the glue relies on, checked before it registers
"""
