"""Training a draft from a target and videos: the paper's training half.

  capture.py      run the target over a dataset; store its text states (and IVSB's visual
                  states) in resumable shards (shards.py, data.py, target_runner.py)
  ivsb.py         intermediate-layer visual state bridging: the bridge and its policy
  objective.py    the loss: stage 1 (target states in) and the MTP stages (own states in)
  recipes.py      draft kinds as peers: sparrow, and the eagle / eagle3 baselines
  train.py        the loop every kind shares (seeded, resumable, kill-safe checkpoints)
  acceptance.py   vLLM's verify loop replayed on held-out samples; adaptive-length calibration
  tree_replay.py  chains vs tree search vs verified trees, replayed
  export.py       the plugin's draft directory from a run
"""
