"""Part 3: the draft's memory at vLLM's GPU defaults, everything counted, for each way it drafts.

vLLM sizes its KV cache from a profile: what the model holds after loading, plus the peak of one
dummy step at max_num_batched_tokens. Whatever the draft allocates outside those two is taken
from memory vLLM already gave away. So, per configuration an engine can serve with (the greedy
chain, in CUDA graphs on CUDA; sampled drafts, every request sampled; tree search):
  load     what the drafter holds once built as the glues build it (serving_draft.py): its
           weights' fused copies, the window cache, per-slot state, the decode graphs' private
           pool (captured at load), a sampled engine's q buffer (drafting/sampling.py)
  profile  the peak of drafter.profile_step at (step_tokens, max_requests), drafted the way the
           configuration drafts: what vLLM's dummy run measures
  steps    the peak of real steps at that bound: max_requests - 1 requests decoding with K drafts
           each beside a prompt chunk that fills the step, and every request decoding
Pass: every step's peak <= its configuration's profiled peak (above what the drafter holds).
Measured with CUDA's allocator on a GPU, elsewhere with the size model (meter.py), which runs
7B shapes at 1,024 requests on the meta device without allocating them.
"""

from __future__ import annotations

import torch

from ..attention import select_backend
from ..drafting.chain import ChainDrafting
from ..drafting.graphs import DecodeGraphs, GraphDrafting, default_buckets
from ..drafting.sampling import Sampled, greedy
from ..v1_runner.q_buffer import QBuffer
from ..drafting.tree import TreeDrafting, TreeSpec
from ..window import TextWindowCache, WindowSpec
from .meter import Meter, mib
from .shapes import CheckShapes
from .workload import RandomTokenIO, Requests, generator, make_drafter, random_draft

CONFIGS = ("chain", "sampled", "tree")


class Engine:
    """A drafter as one engine configuration serves with it: strategy, sampler, q buffer."""

    def __init__(self, s: CheckShapes, config: str, model, io, device: torch.device) -> None:
        self.s, self.config, self.device = s, config, device
        self.drafter = make_drafter(s, model, io, select_backend(device), device, s.dtype, s.max_requests,
                                    s.max_text_tokens)
        self.q = QBuffer(s.max_requests, s.k, s.vocab, device) if config == "sampled" else None
        if config == "tree":
            self.drafting = TreeDrafting(TreeSpec(s.tree_topk, s.tree_topk * (s.k - 1)))
        elif device.type == "cuda":  # the greedy chain's decode steps in CUDA graphs, captured at load
            self.drafting = GraphDrafting(DecodeGraphs(self.drafter, s.k, default_buckets(s.max_requests), True),
                                          ChainDrafting())
        else:
            self.drafting = ChainDrafting()
        self.drafting.capture()

    def sampler(self, temperature: float):
        if self.q is None:
            return greedy
        temps = torch.full((self.s.max_requests,), temperature, device=self.device)
        return Sampled(temps, generator(self.device, 5), self.q)


def run(s: CheckShapes, device: torch.device) -> dict:
    meter = Meter(device)
    model, io = random_draft(s, device, s.dtype), RandomTokenIO(s, device, s.dtype)
    results = [measure(s, config, model, io, device, meter) for config in CONFIGS]
    cache = TextWindowCache.bytes_needed(WindowSpec(s.anchors, s.window), s.max_requests, s.k, s.max_text_tokens,
                                         s.kv_heads, s.head_dim, s.dtype)
    return {"meter": meter.kind, "max_requests": s.max_requests, "k": s.k, "step_tokens": s.step_tokens,
            "window_cache_mib": mib(cache), "q_buffer_mib": mib(QBuffer.bytes_needed(s.max_requests, s.k, s.vocab)),
            "configs": results, "passed": all(r["passed"] for r in results)}


def measure(s: CheckShapes, config: str, model, io, device: torch.device, meter: Meter) -> dict:
    with meter.measure() as load:
        engine = Engine(s, config, model, io, device)
    with meter.measure() as profile:
        engine.drafter.profile_step(s.step_tokens, s.max_requests, s.k, engine.drafting, engine.sampler(1.0))
    steps = [bound_step(s, engine, meter, decodes) for decodes in (s.max_requests - 1, s.max_requests)]
    return {"config": config, "drafting": engine.drafting.describe(), "load_mib": mib(load.held),
            "profile_peak_mib": mib(profile.peak), "steps": steps,
            "passed": all(st["peak_mib"] <= mib(profile.peak) for st in steps)}


def bound_step(s: CheckShapes, engine: Engine, meter: Meter, decodes: int) -> dict:
    """`decodes` requests decoding with K drafts each beside a prompt chunk of the rows left in
    the step (all text: the most packed rows), every sampled request at T = 0.7: the peak bytes
    of that step's draft work. The requests' prompts and a first decode step run unmeasured."""
    drafter, K = engine.drafter, s.k
    decodes = min(decodes, s.step_tokens // (K + 1))
    chunk = min(s.step_tokens - decodes * (K + 1), s.max_text_tokens // 2) if decodes < s.max_requests else 0
    reqs = Requests(s, engine.device, s.dtype, seed=decodes)
    rids = [f"d{i}" for i in range(decodes)]
    for rid in rids:
        reqs.join(rid, 8)
    sample = engine.sampler(0.7)
    engine.drafting.step(drafter, reqs.step(rids), K, sample)  # their prompts
    engine.drafting.step(drafter, reqs.step(rids, accept_all=True), K, sample)  # now they verify K drafts each
    joining = ["chunk"] if chunk > 0 else []
    if joining:
        reqs.join("chunk", chunk, chunk)
    batch = reqs.step(rids + joining, accept_all=True)
    with meter.measure() as step:
        engine.drafting.step(drafter, batch, K, sample)
    drafter.release(rids + joining)
    return {"decodes": decodes, "chunk_rows": chunk, "decode_only": batch.decode_only, "peak_mib": mib(step.peak)}
