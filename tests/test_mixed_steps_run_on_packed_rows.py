"""A step where prompt chunks join decoding requests runs the draft on the rows it has.

Packed rows (drafter._commit_packed): request after request, each bounded by its text rows, never
B x the longest chunk; every row is projected and stored, attention and the MLP run for each
request's last entry only. Pinned three ways:
- at a 7B draft's width (hidden 3584, 28/4 heads of 128, vocab 152k) and a GPU-sized step (255
  requests decoding beside an 8k-row video prompt chunk) on the meta device: the projections run
  on the packed rows only, attention and the MLP on one row per request, and nothing is read back
  from the device (meta tensors have no values, so any host read raises);
- a long text prompt (600 and 3,000 tokens) arriving while 16 video requests decode, in a real
  vLLM engine: greedy output equals the target's without speculation, token for token, and every
  step's drafts (those carrying the chunks among them) equal the training model's dense
  recomputation (tests/support/dense_reference.py), so a draft bug cannot hide behind the verifier;
- the packed store writes what the padded layout writes (tests/test_triton_window_attention_matches_torch.py).
"""

import numpy as np
import pytest
import torch
from conftest import close_llm, make_llm

from vllm_sparrow.attention import TorchWindowAttention
from vllm_sparrow.config import SparrowConfig
from vllm_sparrow.drafter import SparrowDrafter, StepBatch
from vllm_sparrow.drafting.chain import CHAIN
from vllm_sparrow.model import SparrowDraftModel

K = 3


class _RowCounter:
    """The serving layer, counting the rows of every draft forward and of its halves
    (project: up to attention; finish: attention output -> next state)."""

    def __init__(self, layer):
        self.layer, self.rows = layer, []

    def __getattr__(self, name):
        return getattr(self.layer, name)

    def __call__(self, hidden, embeds, positions, attend):
        self.rows.append(("forward", hidden.shape[0]))
        return self.layer(hidden, embeds, positions, attend)

    def project(self, hidden, embeds, positions):
        self.rows.append(("project", hidden.shape[0]))
        return self.layer.project(hidden, embeds, positions)

    def finish(self, x, attn):
        self.rows.append(("finish", x.shape[0]))
        return self.layer.finish(x, attn)


def test_a_video_chunk_beside_255_decodes_runs_the_draft_on_its_own_rows_at_7b_width():
    H, V, VIS = 3584, 152_064, 151_656
    cfg = SparrowConfig(hidden_size=H, num_attention_heads=28, num_key_value_heads=4, head_dim=128,
                        intermediate_size=18_944, vocab_size=V, anchor_tokens=4, window_tokens=512)
    meta = torch.device("meta")
    model = SparrowDraftModel(cfg).to(meta).eval()
    table = torch.empty(V, H, device=meta)

    class IO:
        def embed(self, ids):
            return table[ids]

        def logits(self, h):
            return h @ table.T

    drafter = SparrowDrafter(model, IO(), (VIS,), TorchWindowAttention(), meta, torch.float32,
                             max_requests=1024, max_draft_tokens=K, max_text_tokens=32_768)
    counter = drafter.layer = _RowCounter(drafter.layer)
    decodes, chunk, chunk_text = 255, 8192 - 255 * (K + 1), 600  # vLLM's H200 default: 8k tokens a step
    qlen = np.array([K + 1] * decodes + [chunk])
    T, B = int(qlen.sum()), decodes + 1
    e = lambda *shape, dt=torch.long: torch.empty(*shape, dtype=dt, device=meta)  # noqa: E731
    batch = StepBatch(
        req_ids=[f"r{b}" for b in range(B)], token_ids=e(T), hidden=e(T, H, dt=torch.float32),
        query_start=np.concatenate([[0], np.cumsum(qlen)]), num_valid=e(B), seq_start=e(B),
        num_prompt_tokens=e(B), next_token=e(B), mid_prefill=e(B, dt=torch.bool),
        text_bound=np.full(B, 4096), text_rows=np.array([K + 1] * decodes + [chunk_text]))
    drafts = CHAIN.step(drafter, batch, K)
    ids, probs = drafts.ids, drafts.probs
    assert ids.shape == (B, K) and ids.device == meta and probs is None
    packed = decodes * (K + 2) + chunk_text + 1  # each request's text rows + 1 for a pending state
    # Projected (and stored) on the packed rows, not B x the chunk (2 million rows); attention and
    # the MLP on one row per request (the draft is one layer: only the last entry's output is read);
    # then the chained forwards, one row per request.
    assert counter.rows == [("project", packed), ("finish", B)] + [("forward", B)] * (K - 1), counter.rows


# ---- a long text prompt joins 16 video decodes, in a real engine -----------------------------

KIND, DECODES = "qwen2_5_vl", 16


def _text_prompt(target, n_tokens: int) -> list[int]:
    from transformers import AutoTokenizer

    from sparrow_world.tiny_targets import make_prompt

    tok = AutoTokenizer.from_pretrained(str(target))
    words = " ".join(["describe the red square moving left"] * (n_tokens // 4))
    ids = tok(make_prompt(KIND, target, words, None), add_special_tokens=False)["input_ids"]
    return ids[: n_tokens - 8] + ids[-8:]  # the chat template's end kept


def _run(llm, videos, texts, params):
    """16 video requests until all decode, then each text prompt joins; every request's token ids
    and prompt length."""
    from vllm import TokensPrompt

    engine = llm.llm_engine
    for i, v in enumerate(videos):
        engine.add_request(f"v{i}", v, params)
    outputs, prompt_lens, joining, decoding_steps = {}, {}, list(texts), 0
    while engine.has_unfinished_requests():
        step = engine.step()
        for out in step:
            if out.finished:
                outputs[out.request_id] = list(out.outputs[0].token_ids)
                prompt_lens[out.request_id] = len(out.prompt_token_ids)
        videos_out = [out for out in step if out.request_id.startswith("v")]
        if len(videos_out) == len(videos) and all(len(o.outputs[0].token_ids) >= 2 for o in videos_out):
            decoding_steps += 1
        if joining and decoding_steps >= 3 * (len(texts) - len(joining) + 1):
            # every video decodes: a text prompt arrives (one at a time, a few steps apart)
            rid = f"t{len(texts) - len(joining)}"
            engine.add_request(rid, TokensPrompt(prompt_token_ids=joining.pop(0)), params)
    return outputs, prompt_lens


def _profiled_rows(worker):
    """vLLM's memory profile run (on GPU, before the KV cache is sized; the CPU runner skips it
    in eager mode, so it is run here by hand): the rows the drafter's profile step packed."""
    worker.model_runner.profile_run()
    return getattr(worker.model_runner.drafter, "profiled_rows", 0)


@pytest.fixture(scope="module")
def runs(target_dirs, trained_drafts, clips):
    from vllm import SamplingParams

    from support.engine_probe import drafter_inputs, record_drafter_inputs
    from sparrow_world.tiny_targets import make_prompt

    target, draft = target_dirs(KIND), trained_drafts(KIND)
    frames, meta = clips(8)
    prompt = make_prompt(KIND, target, "describe the red square moving left", "video")
    videos = [{"prompt": prompt, "multi_modal_data": {"video": [(frames, meta)]}} for _ in range(DECODES)]
    texts = [_text_prompt(target, 600), _text_prompt(target, 3000)]
    params = SamplingParams(temperature=0.0, max_tokens=48, ignore_eos=True)
    settings = dict(max_num_seqs=DECODES + 2, max_num_batched_tokens=4096, enable_prefix_caching=False)
    plain = make_llm(target, **settings)
    reference, _ = _run(plain, videos, texts, params)
    close_llm(plain)
    llm = make_llm(target, **settings, speculative_config={
        "method": "sparrow", "model": str(draft), "num_speculative_tokens": K})
    record_drafter_inputs(llm)
    served, prompt_lens = _run(llm, videos, texts, params)
    steps = list(drafter_inputs(llm))
    profiled = llm.collective_rpc(_profiled_rows)[0]
    close_llm(llm)
    return dict(reference=reference, served=served, prompt_lens=prompt_lens, steps=steps, profiled=profiled,
                settings=settings,
                target=target, draft=draft)


def test_greedy_output_equals_no_speculation_when_long_text_prompts_join_video_decodes(runs):
    reference, served = runs["reference"], runs["served"]
    assert set(served) == set(reference) and len(served) == DECODES + 2
    for rid in reference:
        assert served[rid] == reference[rid], rid


def _query_lens(step) -> list[int]:
    return np.diff(step["row_start"] + [len(step["token_ids"])]).tolist()


def test_the_steps_carrying_long_chunks_draft_what_the_dense_reference_drafts(runs):
    """Every step's drafts against the training model's dense recomputation; among them the
    steps where a 600- or 3,000-token chunk sat beside (nearly) every decode."""
    from transformers import AutoTokenizer

    from support.dense_reference import StreamReplay, check_engine_drafts, placeholder_ids
    from vllm_sparrow.checkpoint import load_draft
    from vllm_sparrow.training.target_runner import HFTarget

    steps = runs["steps"]
    joins = [i for i, s in enumerate(steps) if max(_query_lens(s)) >= 600
             and sum(q <= K + 1 for q in _query_lens(s)) >= DECODES - 2]
    assert len(joins) >= 2, [_query_lens(s) for s in steps if max(_query_lens(s)) > K + 1][:4]
    visual = placeholder_ids(KIND, AutoTokenizer.from_pretrained(str(runs["target"])))
    checked = {i + d for i in joins for d in range(3)}  # each join step and the two after it
    counts = check_engine_drafts(steps, StreamReplay(visual, runs["prompt_lens"]), load_draft(runs["draft"]),
                                 HFTarget(str(runs["target"])), only=checked)
    assert counts["drafting"] >= DECODES * len(checked), counts  # every decode drafted in those steps


def test_vllms_memory_profile_runs_the_largest_step_through_the_draft(runs):
    """vLLM sizes its KV cache from the peak memory of its profile run; the proposer's dummy_run
    drafts the largest step it can schedule there, so the draft's activations are in that peak."""
    settings = runs["settings"]
    assert runs["profiled"] >= settings["max_num_batched_tokens"] + 1, runs["profiled"]


def test_the_profile_step_leaves_every_request_as_it_was():
    from vllm_sparrow.drafter import StepBatch

    H, V = 64, 50
    cfg = SparrowConfig(hidden_size=H, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                        intermediate_size=96, vocab_size=V, anchor_tokens=2, window_tokens=8)
    torch.manual_seed(0)
    model = SparrowDraftModel(cfg).eval()
    table = torch.randn(V, H)

    class IO:
        def embed(self, ids):
            return table[ids]

        def logits(self, h):
            return h @ table.T

    drafter = SparrowDrafter(model, IO(), (7,), TorchWindowAttention(), torch.device("cpu"), torch.float32,
                             max_requests=4, max_draft_tokens=K, max_text_tokens=64)
    batch = StepBatch.from_lists(["a"], torch.arange(10, 22), torch.randn(12, H), [0], [12], [0], [12],
                                 torch.tensor([30]), [False])
    CHAIN.step(drafter, batch, K)
    state, cache_k = drafter.state.clone(), drafter.cache.k[:-1].clone()
    counter = drafter.layer = _RowCounter(drafter.layer)
    rows = drafter.profile_step(num_tokens=500, num_requests=12, num_draft=K, drafting=CHAIN)  # chunks past the RoPE table split
    assert counter.rows[0] == ("project", rows) and rows == 500 + 12  # every row text, + 1 per request (pending)
    # no step holds more requests than vLLM schedules, each at most the RoPE table's positions
    counter.rows.clear()
    capped = drafter.profile_step(num_tokens=500, num_requests=4, num_draft=K, drafting=CHAIN)
    assert counter.rows[0] == ("project", capped) and capped == 4 * (68 - K - 2) + 4
    assert torch.equal(drafter.state[:-1], state[:-1]) and torch.equal(drafter.cache.k[:-1], cache_k)
    assert drafter.stats()["live_requests"] == ["a"]
