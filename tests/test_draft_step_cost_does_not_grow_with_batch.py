"""A draft step's fixed cost does not grow with the batch, and its decode path never reads the
device from the host.

Counted, not timed: aten ops dispatched inside the proposer's propose() per engine step, in a
real vLLM engine, at batch 1 and batch 16 (16 requests decoding together); and the drafter's
decode step run on the meta device, where any .item(), .tolist(), bool(tensor) or
data-dependent shape raises.
"""

import pytest
import torch
from conftest import TRAINED_TEXTS, close_llm, make_llm
from vllm import SamplingParams

from vllm_sparrow.attention import TorchWindowAttention
from vllm_sparrow.config import SparrowConfig
from vllm_sparrow.drafter import SparrowDrafter, StepBatch
from vllm_sparrow.drafting.chain import CHAIN
from vllm_sparrow.model import SparrowDraftModel
from sparrow_world.bench.op_count import count_draft_ops, draft_op_records
from sparrow_world.tiny_targets import make_prompt

KIND, K = "qwen2_5_vl", 3
PARAMS = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)


@pytest.fixture(scope="module")
def records(target_dirs, trained_drafts):
    target, draft = target_dirs(KIND), trained_drafts(KIND)
    texts = [f"{t} {i}" for i in range(8) for t in TRAINED_TEXTS]  # 16 prompts
    prompts = [make_prompt(KIND, target, t, None) for t in texts]
    llm = make_llm(target, max_num_seqs=16, speculative_config={
        "method": "sparrow", "model": str(draft), "num_speculative_tokens": K})
    out = {}
    for batch in (1, 16):
        count_draft_ops(llm)
        llm.generate(prompts[:batch], PARAMS, use_tqdm=False)
        out[batch] = [r for r in draft_op_records(llm) if r["max_query"] <= K + 1]
    close_llm(llm)
    return out


def test_batch_16_needs_at_most_1_2x_the_ops_of_batch_1(records):
    one = [r["ops"] for r in records[1] if r["batch"] == 1]
    sixteen = [r["ops"] for r in records[16] if r["batch"] == 16]
    assert len(one) >= 3 and len(sixteen) >= 3, "both runs must reach decode steps"
    ratio = max(sixteen) / min(one)
    assert ratio <= 1.2, f"ops per step: batch 1 {min(one)}, batch 16 {max(sixteen)} ({ratio:.2f}x)"


def test_decode_steps_read_nothing_back_from_the_device(records):
    reads = [r["host_reads"] for rs in records.values() for r in rs]
    assert reads and not any(reads), f"host reads in decode steps: {[r for r in reads if r][:3]}"


def test_the_drafters_decode_step_runs_on_the_meta_device():
    """Meta tensors have shapes and no values: any host read of a value raises here."""
    H, V = 64, 50
    cfg = SparrowConfig(hidden_size=H, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                        intermediate_size=96, vocab_size=V, anchor_tokens=2, window_tokens=8)
    meta = torch.device("meta")
    model = SparrowDraftModel(cfg).to(meta).eval()
    table = torch.empty(V, H, device=meta)

    class IO:
        def embed(self, ids):
            return table[ids]

        def logits(self, h):
            return h @ table.T

    drafter = SparrowDrafter(model, IO(), (7,), TorchWindowAttention(), meta, torch.float32,
                             max_requests=16, max_draft_tokens=K, max_text_tokens=128)
    B = 16
    rows = [0] + [K + 1 - (b % 2) for b in range(B - 1)]  # verify rows, some trimmed by the scheduler
    starts = torch.tensor(rows).cumsum(0).tolist()
    T = starts[-1] + K + 1
    batch = StepBatch(
        req_ids=[f"r{b}" for b in range(B)], token_ids=torch.empty(T, dtype=torch.long, device=meta),
        hidden=torch.empty(T, H, device=meta), query_start=torch.tensor(starts + [T]).numpy(),
        num_valid=torch.empty(B, dtype=torch.long, device=meta), seq_start=torch.empty(B, dtype=torch.long, device=meta),
        num_prompt_tokens=torch.empty(B, dtype=torch.long, device=meta),
        next_token=torch.empty(B, dtype=torch.long, device=meta), mid_prefill=torch.empty(B, dtype=torch.bool, device=meta))
    drafts = CHAIN.step(drafter, batch, K)
    ids, probs = drafts.ids, drafts.probs
    assert ids.shape == (B, K) and ids.device == meta and probs is None
