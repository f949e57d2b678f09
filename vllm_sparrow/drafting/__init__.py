"""Drafting strategies, as peers: how K draft tokens per request are drafted from a committed step.

  step.py    the step's named results (StepBatch, Committed, Drafts) and the two interfaces:
             DraftCore (what a strategy uses of the drafter) and DraftingStrategy (what a
             runner's glue asks of a strategy)
  chain.py   ChainDrafting (K chained forwards, greedy or sampled) and StoppingChainDrafting
             (adaptive length's greedy chain, stopped once no request would verify more)
  tree.py    TreeDrafting: EAGLE-2-style search inside the draft, its best path as the chain
  graphs.py  GraphDrafting: the greedy decode step replayed in CUDA graphs
  choice.py  the rule that picks one when the draft loads, and the inputs it reads

Nothing here knows which vLLM runner it serves. Imported by submodule (this file imports nothing,
so the drafter can import the step's types without loading the peers).
"""
