"""A sampled draft's distribution q is made where vLLM's rejection sampler reads it, never stacked
beside it (drafting/sampling.py):
- vLLM 0.32/0.33 (V1 runner): q lives in one [max_requests, K, vocab] float32 buffer allocated
  once; the drafts hand the runner a view of it, and a step allocates no [B, K, vocab] of its own
  (at 7B widths and 1,024 requests, on the meta device, counted by the GPU check's size model);
- vLLM 0.34 (V2 runner): the draft logits are rounded into the request's row of vLLM's draft-logits
  cache and the token is drawn from softmax(stored / T), which is what the verifier recomputes:
  with a bf16 head, q of the unrounded logits differs from it by far more than float noise.
"""

import pytest
import torch

from vllm_sparrow.attention import TorchWindowAttention
from vllm_sparrow.config import SparrowConfig
from vllm_sparrow.drafter import SparrowDrafter, StepBatch
from vllm_sparrow.drafting.chain import CHAIN
from vllm_sparrow.drafting.sampling import Sampled
from vllm_sparrow.v1_runner.q_buffer import QBuffer
from vllm_sparrow.v2_runner.draft_logits import LogitRows
from vllm_sparrow.gpu_check.meter import SizeModel
from vllm_sparrow.model import SparrowDraftModel

H, V, K = 32, 97, 4


class _IO:
    def __init__(self, device="cpu"):
        g = torch.Generator().manual_seed(2)
        self.table = torch.randn(V, H, generator=g).to(device) * 3

    def embed(self, ids):
        return self.table[ids]

    def logits(self, h):
        return h @ self.table.T


def _drafter(device="cpu", max_requests=4, vocab=V, hidden=H, heads=4, kv=2, dim=8, io=None):
    cfg = SparrowConfig(hidden_size=hidden, num_attention_heads=heads, num_key_value_heads=kv, head_dim=dim,
                        intermediate_size=2 * hidden, vocab_size=vocab, anchor_tokens=2, window_tokens=8)
    with torch.device(device):
        model = SparrowDraftModel(cfg).eval()
    return SparrowDrafter(model, io or _IO(device), (), TorchWindowAttention(), torch.device(device), torch.float32,
                          max_requests=max_requests, max_draft_tokens=K, max_text_tokens=64)


def _prompts(n, length=6):
    g = torch.Generator().manual_seed(3)
    tokens, hidden = torch.randint(0, V, (n * length,), generator=g), torch.randn(n * length, H, generator=g)
    return StepBatch.from_lists([f"r{i}" for i in range(n)], tokens, hidden, [i * length for i in range(n)],
                                [length] * n, [0] * n, [length] * n, torch.randint(0, V, (n,), generator=g),
                                [False] * n)


def test_v1_drafts_hand_the_runner_a_view_of_the_buffer_q_was_made_in():
    drafter, q = _drafter(), QBuffer(4, K, V, "cpu")
    temps = torch.tensor([0.0, 0.7, 1.0])
    drafts = CHAIN.step(drafter, _prompts(3), K, Sampled(temps, torch.Generator().manual_seed(1), q))
    assert drafts.sampled and drafts.probs.shape == (3, K, V)
    assert drafts.probs.untyped_storage().data_ptr() == q.q.untyped_storage().data_ptr()  # no copy
    torch.testing.assert_close(drafts.probs.sum(-1), torch.ones(3, K))
    assert torch.equal(drafts.probs[0].max(-1).values, torch.ones(K))  # the greedy request: one-hot
    assert bool((drafts.probs.gather(-1, drafts.ids[..., None]) > 0).all())


def test_v2_draws_from_the_rounded_logits_the_verifier_reads():
    values = torch.zeros(6, K, V, dtype=torch.bfloat16)
    rows = torch.tensor([4, 1, 2])
    logits = torch.randn(3, V, generator=torch.Generator().manual_seed(5)) * 4
    temps = torch.tensor([0.7, 1.3, 0.4])
    ids, q = Sampled(temps, torch.Generator().manual_seed(6), LogitRows(values, rows))(logits, 2)
    verifier = (values[rows, 2].float() / temps[:, None]).softmax(-1)  # vLLM 0.34: softmax(stored / T)
    torch.testing.assert_close(q, verifier, rtol=1e-5, atol=1e-8)
    unrounded = (logits / temps[:, None]).softmax(-1)
    assert (q - unrounded).abs().max() > 1e-3  # what drawing from the unrounded logits would have got wrong
    assert torch.equal(values[rows, 2], logits.to(torch.bfloat16)) and values[[0, 3, 5]].abs().sum() == 0


def test_v2_rows_of_a_reduced_vocabulary_put_no_mass_outside_it():
    values = torch.zeros(3, K, V, dtype=torch.float32)
    columns = torch.tensor([3, 10, 50, 96])
    logits = torch.randn(2, 4)
    _, q = Sampled(torch.tensor([0.9, 0.9]), torch.Generator().manual_seed(7),
                   LogitRows(values, torch.tensor([0, 2]), columns))(logits, 0)
    stored = values[[0, 2], 0]
    outside = torch.ones(V, dtype=torch.bool)
    outside[columns] = False
    assert torch.isinf(stored[:, outside]).all() and torch.equal(stored[:, columns], logits)
    torch.testing.assert_close((stored / 0.9).softmax(-1)[:, columns], q)


def test_a_sampled_step_at_1024_requests_and_7b_widths_allocates_no_b_by_k_by_vocab_tensor():
    """On the meta device: 7B widths, a 152,064-token vocabulary, 1,024 requests each drafting 8
    tokens. The sampled chain's step allocates its [B, vocab] temporaries only, the same as a greedy
    step's plus the exponential race's noise: far below the 4.6 GiB a stacked [B, K, vocab] q takes."""
    B, K8, vocab, hidden = 1024, 8, 152_064, 3584
    meta = torch.device("meta")
    table = torch.empty(vocab, hidden, device=meta, dtype=torch.bfloat16)

    class IO:
        def embed(self, ids):
            return table[ids]

        def logits(self, h):
            return h.to(table.dtype) @ table.T

    cfg = SparrowConfig(hidden_size=hidden, num_attention_heads=28, num_key_value_heads=4, head_dim=128,
                        intermediate_size=18_944, vocab_size=vocab, anchor_tokens=4, window_tokens=512)
    model = SparrowDraftModel(cfg).to(meta).to(torch.bfloat16).eval()
    drafter = SparrowDrafter(model, IO(), (), TorchWindowAttention(), meta, torch.bfloat16, max_requests=B,
                             max_draft_tokens=K8, max_text_tokens=4096)
    q = QBuffer(B, K8, vocab, meta)
    e = lambda *shape, dt=torch.long: torch.empty(*shape, dtype=dt, device=meta)  # noqa: E731
    import numpy as np

    batch = StepBatch([f"r{b}" for b in range(B)], e(B * 2), e(B * 2, hidden, dt=torch.bfloat16),
                      np.arange(0, 2 * B + 1, 2), e(B), e(B), e(B), e(B), e(B, dt=torch.bool),
                      text_bound=np.full(B, 2), text_rows=np.full(B, 2))
    peaks = {}
    for name, sample in (("greedy", None), ("sampled", Sampled(e(B, dt=torch.float32), None, q))):
        with SizeModel() as size:
            CHAIN.step(drafter, batch, K8, *(() if sample is None else (sample,)))
        peaks[name] = size.peak
        drafter.release(batch.req_ids)
    row = B * vocab * 4  # one [B, vocab] float32
    assert peaks["sampled"] - peaks["greedy"] <= 2 * row, peaks  # the race's noise (and a float copy at most)
    assert peaks["sampled"] < QBuffer.bytes_needed(B, K8, vocab) / 2
