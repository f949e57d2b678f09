"""The decode step as CUDA graphs replay it (drafting/graphs.py: static buffers, batches padded to
a bucket with sink-slot requests, stale rows left from earlier steps) drafts exactly what the
eager drafter drafts, and the engine stays lossless at batch 16 with prefills mixed in, on
that path and on the eager one.

Capture itself needs CUDA; the buffers, padding and bucket choice are the same code with or
without capture, and run here with capture=False (SPARROW_DRAFT_GRAPHS=eager in the engine).
"""

import os
import random

import pytest
import torch
from conftest import close_llm, make_llm
from vllm import SamplingParams

from vllm_sparrow.attention import TorchWindowAttention
from vllm_sparrow.config import SparrowConfig
from vllm_sparrow.drafting.graphs import DecodeGraphs, GraphDrafting, default_buckets
from vllm_sparrow.drafting.chain import CHAIN, ChainDrafting
from vllm_sparrow.drafting.step import greedy
from vllm_sparrow.drafter import SparrowDrafter, StepBatch
from vllm_sparrow.model import SparrowDraftModel
from support.engine_probe import drafter_inputs, record_drafter_inputs
from sparrow_world.tiny_targets import make_prompt

H, V, K = 64, 50, 3


class _IO:
    def __init__(self, device):
        g = torch.Generator().manual_seed(3)
        self.emb, self.head = torch.randn(V, H, generator=g), torch.randn(V, H, generator=g) / H**0.5
        self.emb, self.head = self.emb.to(device), self.head.to(device)

    def embed(self, ids):
        return self.emb[ids]

    def logits(self, h):
        return h @ self.head.T


def _drafters(buckets, device="cpu", backend=TorchWindowAttention, capture=False):
    cfg = SparrowConfig(hidden_size=H, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                        intermediate_size=96, vocab_size=V, anchor_tokens=2, window_tokens=6)
    torch.manual_seed(0)
    model = SparrowDraftModel(cfg).eval()
    for p in model.parameters():
        torch.nn.init.normal_(p, std=0.2)
    model = model.to(device)
    make = lambda: SparrowDrafter(model, _IO(device), (7,), backend(), torch.device(device),  # noqa: E731
                                  torch.float32, max_requests=8, max_draft_tokens=K, max_text_tokens=256)
    eager, graphed = make(), make()
    drafting = GraphDrafting(DecodeGraphs(graphed, K, buckets, capture=capture, depths=(1,)), ChainDrafting())
    drafting.graphs.capture()  # a no-op without capture
    return eager, (graphed, drafting)


def test_bucketed_static_buffer_steps_draft_like_the_eager_drafter():
    _lockstep(*_drafters([2, 4, 8]), "cpu")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
def test_captured_graphs_draft_like_the_eager_drafter_on_cuda():
    from vllm_sparrow.attention import TritonWindowAttention

    eager, graphed = _drafters([2, 4, 8], "cuda", TritonWindowAttention, capture=True)
    assert sorted(graphed[1].graphs.graphs) == [(b, k) for b in (2, 4, 8) for k in (1, K)]
    _lockstep(eager, graphed, "cuda")


def _lockstep(eager, graphed, device):
    """Drive both drafters with the same random steps (prompts joining decodes, batch sizes
    changing, requests leaving, the depth moving between the graphs' depths 1 and K and one they
    do not cover, as an engine's per-batch-size schedule moves it) and compare every draft.
    graphed: (drafter, its GraphDrafting)."""
    graphed, drafting = graphed
    rnd = random.Random(5)
    reqs = {}  # id -> [seq_len, prompt_len, next_token, drafts]
    for step in range(40):
        live = list(reqs)
        if len(live) < 8 and (step % 5 == 0 or not live):  # a prompt joins, mixed into decodes
            rid = f"r{step}"
            reqs[rid] = [0, rnd.randrange(3, 12), None, []]
            live.append(rid)
        batch_ids = rnd.sample(live, rnd.randrange(1, len(live) + 1))  # batch sizes vary: stale rows
        toks, hid, starts, valid, seq, prompt, nxt, mid = [], [], [], [], [], [], [], []
        for rid in batch_ids:
            s, p, n, drafts = reqs[rid]
            rows = [rnd.randrange(8, V) for _ in range(p)] if s == 0 else [n] + drafts
            starts.append(len(toks))
            toks += rows
            hid.append(torch.randn(len(rows), H))
            nv = len(rows) if s == 0 else rnd.randrange(1, len(rows) + 1)
            valid.append(nv)
            seq.append(s)
            prompt.append(p)
            mid.append(False)
            reqs[rid][0] = s + nv
            reqs[rid][2] = rnd.randrange(8, V)
            nxt.append(reqs[rid][2])
        batch = StepBatch.from_lists(batch_ids, torch.tensor(toks, device=device), torch.cat(hid).to(device),
                                     starts, valid, seq, prompt, torch.tensor(nxt, device=device), mid)
        depth = (K, 1, K, 2)[step % 4]
        a = CHAIN.step(eager, batch, depth).ids
        b = drafting.step(graphed, batch, depth, greedy).ids
        assert torch.equal(a, b), f"step {step}: {a.tolist()} != {b.tolist()}"
        for i, rid in enumerate(batch_ids):
            reqs[rid][3] = a[i].tolist()
        if step % 9 == 8:  # a request finishes; its slot is reused by a newcomer
            gone = batch_ids[0]
            del reqs[gone]
            eager.release([gone])
            graphed.release([gone])
    assert drafting.graphs.replays >= 15 and set(drafting.graphs.depths) == {1, K}
    assert eager.stats()["text_entries"] == graphed.stats()["text_entries"]


def test_buckets_cover_every_batch_size_up_to_the_engines_limit():
    for max_seqs in (1, 5, 16, 40, 1024):
        buckets = default_buckets(max_seqs)
        assert buckets[-1] == min(max_seqs, 256) and buckets == sorted(set(buckets))
        assert all(b <= max_seqs for b in buckets)


def _replays(worker):
    graphs = getattr(worker.model_runner.drafter.served.drafting, "graphs", None)
    return None if graphs is None else graphs.replays


@pytest.fixture(scope="module")
def batch16(target_dirs, trained_drafts, clips):
    """16 requests (two with videos, prompts of different lengths) through a 96-token step
    budget: prompts are admitted and chunk-prefilled while others decode."""
    kind = "qwen2_5_vl"
    target, draft = target_dirs(kind), trained_drafts(kind)
    reqs = [{"prompt": make_prompt(kind, target, f"describe clip {i} " + "and more " * (i % 5), None)}
            for i in range(14)]
    reqs += [{"prompt": make_prompt(kind, target, "describe the video", "video"),
              "multi_modal_data": {"video": clips(n)}} for n in (4, 8)]
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    engine = dict(max_num_seqs=16, max_num_batched_tokens=96, long_prefill_token_threshold=48)
    base = make_llm(target, **engine)
    runs = {"plain": [list(o.outputs[0].token_ids) for o in base.generate(reqs, params, use_tqdm=False)]}
    close_llm(base)
    for env, path in (("off", "eager"), ("eager", "static")):
        os.environ["SPARROW_DRAFT_GRAPHS"] = env
        try:
            llm = make_llm(target, **engine, speculative_config={
                "method": "sparrow", "model": str(draft), "num_speculative_tokens": K})
        finally:
            del os.environ["SPARROW_DRAFT_GRAPHS"]
        record_drafter_inputs(llm)
        outs = llm.generate(reqs, params, use_tqdm=False)
        replays = llm.collective_rpc(_replays)[0]
        runs[path] = ([list(o.outputs[0].token_ids) for o in outs], replays, drafter_inputs(llm))
        close_llm(llm)
    return runs


@pytest.mark.parametrize("path", ["eager", "static"])
def test_batch_16_with_prefills_mixed_in_is_lossless(batch16, path):
    outputs, replays, steps = batch16[path]
    assert outputs == batch16["plain"]
    mixed = [s for s in steps if len(s["req_ids"]) >= 8 and max(
        b - a for a, b in zip(s["row_start"], s["row_start"][1:] + [len(s["token_ids"])])) > K + 1]
    assert mixed, "prefill chunks must share steps with decoding requests"
    if path == "static":
        assert replays >= 10, "decode steps must take the static-buffer path"


def test_graph_mode_follows_vllm_switches_and_the_environment(monkeypatch):
    from types import SimpleNamespace

    from vllm_sparrow.drafting.choice import draft_graph_mode

    def cfg(eager=False, mode="FULL_AND_PIECEWISE", tp=1):
        return SimpleNamespace(model_config=SimpleNamespace(enforce_eager=eager),
                               speculative_config=SimpleNamespace(enforce_eager=False),
                               compilation_config=SimpleNamespace(cudagraph_mode=SimpleNamespace(name=mode)),
                               parallel_config=SimpleNamespace(tensor_parallel_size=tp))

    monkeypatch.delenv("SPARROW_DRAFT_GRAPHS", raising=False)
    assert draft_graph_mode(cfg(), torch.device("cuda")) == "capture"
    assert draft_graph_mode(cfg(), torch.device("cpu")) is None
    assert draft_graph_mode(cfg(eager=True), torch.device("cuda")) is None
    assert draft_graph_mode(cfg(mode="NONE"), torch.device("cuda")) is None
    assert draft_graph_mode(cfg(tp=2), torch.device("cuda")) is None
    monkeypatch.setenv("SPARROW_DRAFT_GRAPHS", "off")
    assert draft_graph_mode(cfg(), torch.device("cuda")) is None
    monkeypatch.setenv("SPARROW_DRAFT_GRAPHS", "eager")
    assert draft_graph_mode(cfg(), torch.device("cpu")) == "eager"
    monkeypatch.setenv("SPARROW_DRAFT_GRAPHS", "yes")
    with pytest.raises(ValueError, match="SPARROW_DRAFT_GRAPHS"):
        draft_graph_mode(cfg(), torch.device("cpu"))
