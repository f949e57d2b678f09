"""`sparrow capture --ivsb-keep F` stores the IVSB states of a share F of each sample's visual
positions (the bulk of a capture's bytes), a set fixed by the sample's line index: the states
kept equal the full capture's at those positions, a rerun keeps the same ones, the size estimate
counts only them, and training reads them at their own text positions."""


import pytest
import torch

from vllm_sparrow.training import capture as capture_module
from vllm_sparrow.training.capture import CaptureConfig, capture
from vllm_sparrow.training.ivsb import visual_inputs, visual_text_positions
from vllm_sparrow.training.shards import ShardReader
from support.clip_data import dataset


@pytest.fixture(scope="module")
def captures(workdir, small_clips, target_dirs):
    jsonl = dataset(workdir / "ivsb-keep", small_clips, [
        {"video": f"v{i}.mp4", "prompt": f"describe clip {i}", "response_ids": [40, 41, 42]} for i in range(2)])
    root = jsonl.parent
    base = dict(target=str(target_dirs("qwen2_5_vl")), data=str(jsonl), num_frames=4,
                store_dtype="float32")
    capture(CaptureConfig(out=str(root / "all"), **base), progress=False)
    capture(CaptureConfig(out=str(root / "quarter"), ivsb_keep=0.25, **base), progress=False)
    capture(CaptureConfig(out=str(root / "quarter-again"), ivsb_keep=0.25, **base), progress=False)
    return root, base


def test_the_states_kept_are_the_full_captures_at_those_positions(captures):
    root, _ = captures
    for full, part, again in zip(ShardReader(root / "all"), ShardReader(root / "quarter"),
                                 ShardReader(root / "quarter-again")):
        n_vis = int(full["is_visual"].sum())
        kept = part["visual_kept"]
        assert len(kept) == round(0.25 * n_vis) and torch.equal(kept, kept.sort().values)
        assert torch.equal(part["visual_hidden"], full["visual_hidden"][kept])
        assert torch.equal(again["visual_kept"], kept) and "visual_kept" not in full
        assert torch.equal(part["text_hidden"], full["text_hidden"])


def test_the_estimate_counts_only_the_states_kept(captures, target_dirs):
    from vllm_sparrow.training.data import read_samples
    from vllm_sparrow.training.target_runner import HFTarget

    root, base = captures
    target, sample = HFTarget(base["target"]), next(read_samples(base["data"]))
    for name, keep in (("all", 1.0), ("quarter", 0.25)):
        estimate, _ = capture_module.estimate_sample_bytes(CaptureConfig(out="", ivsb_keep=keep, **base), target, sample)
        stored = sum(t.numel() * t.element_size() for t in ShardReader(root / name)[0].values())
        assert estimate == stored, name


def test_training_reads_the_kept_states_at_their_text_positions(captures):
    from types import SimpleNamespace

    from vllm_sparrow.config import SparrowConfig
    from vllm_sparrow.model import SparrowDraftModel
    from vllm_sparrow.training.ivsb import VisualBridge

    root, _ = captures
    sample = ShardReader(root / "quarter")[0]
    cfg = SimpleNamespace(ivsb=True, visual_fraction=1.0)
    draft = SparrowDraftModel(SparrowConfig(hidden_size=128, num_attention_heads=4, num_key_value_heads=2,
                                            head_dim=32, intermediate_size=64, vocab_size=512))
    _, _, positions = visual_inputs(cfg, draft, VisualBridge(128, 128), sample, torch.Generator(), shown=True)
    assert torch.equal(positions, visual_text_positions(sample["is_visual"])[sample["visual_kept"]])
