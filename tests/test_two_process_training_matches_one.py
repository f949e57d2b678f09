"""Data-parallel `sparrow train` under torchrun (2 processes, gloo, CPU) is the single-process run
with the global batch: 2 ranks x batch_samples b see per step the samples 1 rank x 2b sees, draw
the same IVSB subsets and dropouts for them (from the seed and each sample's place in the stream,
not from a generator the other rank advances) and step with the mean gradient.

Equivalence pinned here:
  - b = 1: 2 ranks x 1 == 1 rank x 2 up to float rounding (weights and AdamW moments): halving a
    gradient is exact and a 2-way all-reduce adds the same two numbers, but one process computes
    both samples' gradient in one backward, so its kernels may round differently (bit for bit on
    the machine this was written on, 6e-8 and 1.7e-6 relative on two CI machines): see REL.
  - b = 2: 2 ranks x 2 vs 1 rank x 4 differ only in the order four gradients are summed
    ((g0+g2)+(g1+g3) against ((g0+g1)+g2)+g3), float32 rounding, carried through AdamW: see REL.
  - log.jsonl (rank 0 writes it) holds the loss and top-1 over both ranks' samples, equal to the
    single process's; a 2-rank run resumed from its checkpoint ends with the uninterrupted weights.
The capture has an odd number of training samples (3: epochs end mid-step) and one of them is
unreadable, so ranks skip samples while the other rank trains (and a skipping rank must still
join every all-reduce: a rank that did not would hang the run into its timeout).
"""

import json
import os
import subprocess
import sys

import pytest
import torch

from vllm_sparrow.training.shards import ShardReader
from vllm_sparrow.training.train import SampleStream, TrainConfig, rank_places, train

STEPS = 6
# Tolerance of the b = 2 pair: the largest difference of any weight or AdamW moment tensor,
# relative to that tensor's largest entry. Measured after 6 steps: 1.4e-4 (the bridge projection,
# where AdamW turns a rounding-level change of a near-zero gradient entry into a step of up to lr),
# 5e-6 elsewhere. 1e-3 leaves room for other CPUs' kernels; the errors this guards against are far
# larger: summing the ranks' gradients instead of averaging them gives 3.0 here (second moments
# 4x; the weights move by only ~1e-5, AdamW being blind to a gradient's scale, hence the moments).
REL = 1e-3  # both pairs


@pytest.fixture(scope="module")
def capture(workdir, small_dataset, target_dirs):
    """The small dataset's four clips from the tiny Qwen2.5-VL target, one sample per shard (3
    train, 1 held out), the second training sample's shard then made unreadable: a rank that draws
    it skips it."""
    from vllm_sparrow.training.capture import CaptureConfig, capture

    cap = workdir / "two-ranks-cap"
    capture(CaptureConfig(target=str(target_dirs("qwen2_5_vl")), data=str(small_dataset), out=str(cap),
                          num_frames=4, max_new_tokens=12, shard_size=1), progress=False)
    shard = ShardReader(cap).where[1][0]
    (cap / shard).write_bytes(b"\x00" * 64)
    return cap


def _torchrun(capture, out, ranks: int, batch: int, steps: int = STEPS) -> None:
    """`sparrow train` under torchrun, as docs/training.md launches it, one thread per rank."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(ranks),
           "-m", "vllm_sparrow.cli", "train", "--capture", str(capture), "--out", str(out), "--steps", str(steps),
           "--batch-samples", str(batch), "--lr", "0.003", "--mtp-steps", "1", "--visual-fraction", "0.5",
           "--visual-drop", "0.5", "--window", "16", "--holdout", "1", "--save-every", "3", "--log-every", "3",
           "--k", "2"]
    done = subprocess.run(cmd, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True,
                          timeout=300)  # a rank left out of an all-reduce hangs: fail, do not wait forever
    # A failing rank's own error comes before torchrun's summary in stderr: keep enough to show it.
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-12000:]


def _in_process(capture, out, batch: int) -> None:
    """The single-process reference, here (no interpreter to start), on one thread as each rank."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        train(TrainConfig(capture=str(capture), out=str(out), steps=STEPS, batch_samples=batch, lr=3e-3, mtp_steps=1,
                          visual_fraction=0.5, visual_drop=0.5, window_tokens=16, holdout=1, save_every=3,
                          log_every=3, speculative_tokens=2), progress=False)
    finally:
        torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def runs(capture, workdir):
    """1 rank x 2 and x 4 (in process); 2 ranks x 1, stopped at step 3 and resumed, and 2 ranks x 2."""
    root = workdir / "two-ranks"
    _in_process(capture, root / "one-x2", 2)
    _in_process(capture, root / "one-x4", 4)
    _torchrun(capture, root / "two-x1", 2, 1, steps=3)
    _torchrun(capture, root / "two-x1", 2, 1)
    _torchrun(capture, root / "two-x2", 2, 2)
    return {name: root / name for name in ("one-x2", "one-x4", "two-x1", "two-x2")}


def _state(run) -> dict[str, torch.Tensor]:
    """Draft and bridge weights and AdamW's moments, by name."""
    ckpt = torch.load(run / "checkpoint.pt", weights_only=False)
    assert ckpt["step"] == STEPS
    out = {f"draft.{k}": v for k, v in ckpt["draft"].items()}
    out |= {f"bridge.{k}": v for k, v in ckpt["bridge"].items()}
    for i, moments in ckpt["opt"]["state"].items():
        out |= {f"opt.{i}.{k}": v for k, v in moments.items() if k != "step"}
    return out


def _logged(run) -> list[dict]:
    return [r for r in map(json.loads, (run / "log.jsonl").read_text().splitlines()) if "loss" in r]


def _relative_difference(a: torch.Tensor, b: torch.Tensor) -> float:
    """Largest difference relative to the tensor's largest entry (moments are ~1e-8, weights ~1e-1)."""
    return ((a - b).abs().max() / a.abs().max().clamp_min(1e-30)).item()


def test_two_ranks_with_batch_one_resumed_equal_one_rank_with_batch_two_to_float_rounding(runs):
    """Also the resume: the 2-rank run stopped after step 3 and was run on to step 6."""
    one, two = _state(runs["one-x2"]), _state(runs["two-x1"])
    assert one.keys() == two.keys()
    worst = {key: _relative_difference(one[key], two[key]) for key in one}
    print("largest relative differences", sorted(worst.items(), key=lambda kv: -kv[1])[:5])
    assert max(worst.values()) < REL, worst


def test_two_ranks_with_batch_two_equal_one_rank_with_batch_four_up_to_summation_order(runs):
    one, two = _state(runs["one-x4"]), _state(runs["two-x2"])
    assert one.keys() == two.keys()
    worst = {key: _relative_difference(one[key], two[key]) for key in one}
    print("largest relative differences", sorted(worst.items(), key=lambda kv: -kv[1])[:5])
    assert max(worst.values()) < REL, worst


def test_the_log_holds_the_loss_over_both_ranks(runs):
    for one, two in (("one-x2", "two-x1"), ("one-x4", "two-x2")):
        a, b = _logged(runs[one]), _logged(runs[two])
        assert [r["step"] for r in a] == [r["step"] for r in b] == [3, 6], "resumed at 3, row 6 once"
        for ra, rb in zip(a, b):
            assert rb["loss"] == pytest.approx(ra["loss"], rel=1e-5), (one, two)
            assert rb["top1"] == ra["top1"], (one, two)


def test_each_rank_draws_the_unreadable_sample_while_the_other_trains():
    """What the runs above go through (seed 0, 3 training samples, capture position 1 unreadable):
    each rank skips it in some step, so a rank with nothing to train joins the all-reduces."""
    stream = SampleStream(0, [0, 1, 2])
    for batch in (1, 2):
        skipped = {rank: [step for step in range(STEPS)
                          if 1 in [stream[p] for p in rank_places(step * batch * 2, batch, rank, 2)]]
                   for rank in (0, 1)}
        assert skipped[0] and skipped[1], skipped
