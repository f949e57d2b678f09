"""A reduced draft vocabulary (draft_vocab.py): export picks the most frequent text tokens of the
training samples, the drafter proposes only those (greedy ids mapped back to target ids,
probabilities zero outside), and vLLM stays lossless with it."""

import shutil

import numpy as np
import pytest
import torch
from conftest import TRAINED_TEXTS, close_llm, make_llm
from vllm import SamplingParams

from vllm_sparrow.attention import TorchWindowAttention
from vllm_sparrow.config import SparrowConfig
from vllm_sparrow.draft_vocab import VOCAB_FILE, SubsetLogits, count_text_tokens, load_vocab, save_vocab, top_tokens
from vllm_sparrow.drafter import SparrowDrafter, StepBatch
from vllm_sparrow.drafting.chain import CHAIN
from vllm_sparrow.drafting.sampling import Sampled
from vllm_sparrow.v1_runner.q_buffer import QBuffer
from vllm_sparrow.model import SparrowDraftModel
from support.engine_probe import spec_counters
from sparrow_world.tiny_targets import make_prompt

H, V, K = 64, 40, 3


def test_top_tokens_are_the_most_frequent_with_ties_to_the_lower_id_and_unseen_ids_last():
    counts = np.array([5, 0, 9, 5, 1])
    assert top_tokens(counts, 3, vocab_size=8).tolist() == [0, 2, 3]
    assert top_tokens(counts, 6, vocab_size=8).tolist() == [0, 1, 2, 3, 4, 5]  # topped up with unseen 1, 5
    assert top_tokens(counts, 100, vocab_size=8).tolist() == list(range(8))
    with pytest.raises(ValueError):
        top_tokens(counts, 0, vocab_size=8)


def _drafter(io):
    cfg = SparrowConfig(hidden_size=H, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                        intermediate_size=96, vocab_size=V, anchor_tokens=2, window_tokens=6)
    torch.manual_seed(0)
    model = SparrowDraftModel(cfg).eval()
    return SparrowDrafter(model, io, (), TorchWindowAttention(), torch.device("cpu"), torch.float32,
                          max_requests=2, max_draft_tokens=K, max_text_tokens=64)


class _IO:
    def __init__(self):
        g = torch.Generator().manual_seed(2)
        self.emb, self.head = torch.randn(V, H, generator=g), torch.randn(V, H, generator=g)

    def embed(self, ids):
        return self.emb[ids]

    def logits(self, h):
        return h @ self.head.T


def _drafts(io, sample=None):
    drafter = _drafter(io)
    g = torch.Generator().manual_seed(4)
    tokens, hidden = torch.randint(0, V, (12,), generator=g), torch.randn(12, H, generator=g)
    batch = StepBatch.from_lists(["a", "b"], tokens, hidden, [0, 6], [6, 6], [0, 0], [6, 6],
                                 torch.tensor([3, 4]), [False, False])
    drafts = CHAIN.step(drafter, batch, K, *(() if sample is None else (sample,)))
    return drafts.ids, drafts.probs


def test_drafts_come_from_the_subset_and_equal_full_drafting_when_it_is_everything():
    io = _IO()
    full, _ = _drafts(io)
    everything, _ = _drafts(SubsetLogits(io, torch.arange(V), io.head, V))
    assert torch.equal(everything, full)
    subset = torch.tensor([1, 5, 7, 11, 20, 33])
    ids, _ = _drafts(SubsetLogits(io, subset, io.head, V))
    assert set(ids.flatten().tolist()) <= set(subset.tolist())


def test_probabilistic_drafts_put_no_mass_outside_the_subset():
    io = _IO()
    subset = torch.tensor([2, 3, 9, 30])

    # q kept as vLLM's V1 runner takes it: [B, K, vocab] over the whole vocabulary
    sample = Sampled(torch.tensor([1.0, 0.7]), torch.Generator().manual_seed(3), QBuffer(2, K, V, "cpu", subset))
    ids, probs = _drafts(SubsetLogits(io, subset, io.head, V), sample)
    assert probs.shape == (2, K, V)
    outside = torch.ones(V, dtype=torch.bool)
    outside[subset] = False
    assert probs[..., outside].abs().max() == 0
    torch.testing.assert_close(probs.sum(-1), torch.ones(2, K))
    assert torch.all(probs.gather(-1, ids[..., None]) > 0)  # each draft is a token it could draw


def test_load_refuses_a_damaged_vocabulary_and_can_be_switched_off(tmp_path, monkeypatch):
    assert load_vocab(tmp_path) is None
    save_vocab(tmp_path, torch.tensor([4, 2]))
    with pytest.raises(ValueError, match="ascending"):
        load_vocab(tmp_path)
    save_vocab(tmp_path, torch.tensor([2, 4]))
    assert load_vocab(tmp_path).tolist() == [2, 4]
    monkeypatch.setenv("SPARROW_DRAFT_VOCAB", "full")
    assert load_vocab(tmp_path) is None


def test_export_writes_the_most_frequent_tokens_of_the_training_samples(small_capture, workdir):
    from vllm_sparrow.training.export import export_run
    from vllm_sparrow.training.shards import ShardReader
    from vllm_sparrow.training.train import TrainConfig, train

    result = train(TrainConfig(capture=str(small_capture), out=str(workdir / "vocab-run"), steps=2, holdout=1,
                               save_every=1, log_every=1), progress=False)
    out = export_run(workdir / "vocab-run", workdir / "vocab-draft", draft_vocab=16)
    ids = load_vocab(out)
    reader = ShardReader(small_capture)
    counts = np.zeros(100_000, dtype=np.int64)
    for i in range(len(reader) - 1):  # the held-out sample is not counted
        s = reader[i]
        np.add.at(counts, s["token_ids"][~s["is_visual"].bool()].numpy(), 1)
    vocab = SparrowConfig.load(result.draft_dir).vocab_size
    assert ids.tolist() == top_tokens(counts[:vocab], 16, vocab).tolist()
    assert np.array_equal(count_text_tokens(small_capture, len(reader) - 1), np.trim_zeros(counts, "b"))
    export_run(workdir / "vocab-run", out)  # re-exported without one: the old subset is gone
    assert not (out / VOCAB_FILE).exists()


@pytest.fixture(scope="module")
def served(target_dirs, trained_drafts, workdir):
    kind = "qwen2_5_vl"
    target = target_dirs(kind)
    prompts = [make_prompt(kind, target, t, None) for t in TRAINED_TEXTS]
    greedy = SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True)
    base = make_llm(target)
    reference = [list(o.outputs[0].token_ids) for o in base.generate(prompts, greedy, use_tqdm=False)]
    close_llm(base)
    # the draft's subset: every token the target writes here, plus others (a covering subset)
    draft = workdir / "draft-with-vocab"
    shutil.copytree(trained_drafts(kind), draft)
    used = sorted({t for ref in reference for t in ref} | set(range(0, 400, 7)))
    save_vocab(draft, torch.tensor(used))
    llm = make_llm(target, disable_log_stats=False, speculative_config={
        "method": "sparrow", "model": str(draft), "num_speculative_tokens": K})
    outputs = [list(o.outputs[0].token_ids) for o in llm.generate(prompts, greedy, use_tqdm=False)]
    counters = spec_counters(llm)
    sampled = llm.generate(prompts, SamplingParams(temperature=0.8, seed=1, max_tokens=16), use_tqdm=False)
    vocab = llm.collective_rpc(lambda w: w.model_runner.drafter.served.drafter.vocab_ids.numel())[0]
    close_llm(llm)
    return dict(reference=reference, outputs=outputs, counters=counters, sampled=sampled, vocab=vocab, used=used)


def test_vllm_is_lossless_and_accepts_drafts_from_the_reduced_vocabulary(served):
    assert served["vocab"] == len(served["used"])  # the plugin loaded the subset
    assert served["outputs"] == served["reference"]
    c = served["counters"]
    assert c["num_accepted_tokens"] > 0.5 * c["num_drafts"], c  # the trained draft still drafts well


def test_sampling_with_the_reduced_vocabulary_runs_in_vllm(served):
    assert all(len(o.outputs[0].token_ids) == 16 for o in served["sampled"])
