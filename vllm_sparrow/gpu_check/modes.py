"""Part 5: the drafting modes a user can switch on, each run once on this device at the check's
shapes, with what must hold of each:

  tree search       (tree_topk/tree_budget) drafts K tokens per request; with one branch per
                    level it drafts exactly the greedy chain
  adaptive length   (stop_confidence) the stopping chain's cut equals the full chain's cut at the
                    same threshold (it only skips forwards nobody would verify)
  sampled drafts    (draft_sample_method probabilistic) drawn with a generator on this device: q
                    rows sum to 1, a greedy request's row is one-hot at its argmax, every drafted
                    token has q > 0; in vLLM 0.34's draft-logits layout (the head's dtype), q is
                    softmax(stored / T) of what was stored, which the verifier recomputes
  reduced vocab     (draft_vocab.safetensors) drafts stay in the subset; sampled q is 0 outside it
  target token I/O  the draft's embedding and LM head taken from a target-shaped model through the
                    product's TargetTokenIO (what serving_draft.py wraps vLLM's target in): drafts
                    equal those of the same tables handed over directly
"""

from __future__ import annotations

import torch

from ..attention import select_backend
from ..draft_vocab import SubsetLogits
from ..drafting.chain import ChainDrafting, StoppingChainDrafting, kept_drafts
from ..drafting.sampling import Sampled, greedy
from ..v1_runner.q_buffer import QBuffer
from ..v2_runner.draft_logits import LogitRows
from ..drafting.tree import TreeDrafting, TreeSpec
from ..model import TargetTokenIO
from .shapes import CheckShapes
from .workload import RandomTokenIO, Requests, generator, make_drafter, random_draft


class _TargetShaped(torch.nn.Module):
    """What TargetTokenIO reads of a vLLM target model: embed_input_ids and compute_logits (the
    target's own tables, as vLLM's VocabParallelEmbedding and LogitsProcessor compute them)."""

    def __init__(self, io: RandomTokenIO) -> None:
        super().__init__()
        self.table, self.head = io.table, io.head

    def embed_input_ids(self, ids):
        return torch.nn.functional.embedding(ids, self.table)

    def compute_logits(self, hidden):
        return torch.nn.functional.linear(hidden.to(self.head.dtype), self.head)


def _drafts(s: CheckShapes, model, io, device, drafting=None, sample=greedy, steps: int = 3, batches=None):
    """Drafts of `steps` engine steps (prompts, then decodes) of a small batch, and the batches:
    (list of Drafts, list of StepBatch). Given `batches`, those are replayed instead (two
    strategies compared on the same inputs)."""
    drafter = make_drafter(s, model, io, select_backend(device), device, s.dtype, s.mode_requests,
                           s.text_tokens + steps * (s.k + 1) + 8)
    reqs = Requests(s, device, s.dtype, seed=17)
    rids = [f"m{i}" for i in range(s.mode_requests)]
    for i, rid in enumerate(rids):
        reqs.join(rid, s.text_tokens // 2 + i, s.text_tokens // 2)
    out, made = [], []
    for i in range(steps):
        batch = batches[i] if batches is not None else reqs.step(rids)
        d = (drafting or ChainDrafting()).step(drafter, batch, s.k, sample)
        if d.probs is not None:
            d.probs = d.probs.clone()  # a view of the q buffer, which the next step overwrites
        if batches is None:
            reqs.took(rids, d.ids)
        out.append(d)
        made.append(batch)
    return out, made


def tree_search(s, model, io, device) -> dict:
    chain, batches = _drafts(s, model, io, device)
    one, _ = _drafts(s, model, io, device, TreeDrafting(TreeSpec(1, s.k)), batches=batches)
    wide, _ = _drafts(s, model, io, device, TreeDrafting(TreeSpec(s.tree_topk, s.tree_topk * (s.k - 1))))
    same = all(torch.equal(a.ids, b.ids) for a, b in zip(chain, one))
    shaped = all(d.ids.shape == (s.mode_requests, s.k) and int(d.ids.max()) < s.vocab for d in wide)
    return {"one_branch_is_the_chain": same, "drafts_k_tokens": shaped, "passed": same and shaped}


def adaptive_length(s, model, io, device) -> dict:
    full, batches = _drafts(s, model, io, device, ChainDrafting(confidence=True))
    results = {}
    for threshold in (0.3, 0.7):
        stopped, _ = _drafts(s, model, io, device, StoppingChainDrafting(threshold), batches=batches)
        results[str(threshold)] = all(kept_drafts(a, threshold) == kept_drafts(b, threshold)
                                      for a, b in zip(full, stopped))
    return {"cut_equals_full_chain": results, "passed": all(results.values())}


def sampled(s, model, io, device) -> dict:
    temps = torch.tensor([0.0 if i % 3 == 0 else 0.7 for i in range(s.mode_requests)], device=device)
    q = QBuffer(s.mode_requests, s.k, s.vocab, device)
    ok = {"sums_to_one": True, "greedy_rows_one_hot": True, "drafted_tokens_possible": True}
    for d in _drafts(s, model, io, device, sample=Sampled(temps, generator(device, 3), q))[0]:
        probs = d.probs.float()  # [B, K, V]
        ok["sums_to_one"] &= bool(torch.allclose(probs.sum(-1), torch.ones_like(probs[..., 0]), atol=1e-4))
        ok["drafted_tokens_possible"] &= bool((probs.gather(-1, d.ids[..., None]) > 0).all())
        greedy_rows = probs[temps == 0]  # [G, K, V]
        ok["greedy_rows_one_hot"] &= bool(((greedy_rows == 0) | (greedy_rows == 1)).all())
    ok["logit_rows_exact"] = _logit_rows_exact(s, device)
    return {**ok, "passed": all(ok.values())}


def _logit_rows_exact(s: CheckShapes, device) -> bool:
    """vLLM 0.34's layout in the model's dtype: the q drawn from is softmax(stored / T), to float
    rounding, and (in a 16-bit dtype) not the q of the unrounded logits, which the verifier never sees."""
    g = generator(device, 4)
    values = torch.zeros(s.mode_requests + 2, s.k, s.vocab, dtype=s.dtype, device=device)
    rows = torch.arange(s.mode_requests, device=device) + 1
    logits = torch.randn(s.mode_requests, s.vocab, generator=g, device=device) * 3
    temps = torch.full((s.mode_requests,), 0.7, device=device)
    _, q = Sampled(temps, g, LogitRows(values, rows))(logits, 1)
    verifier = (values[rows, 1].float() / 0.7).softmax(-1)
    exact = bool(torch.allclose(q, verifier, rtol=1e-5, atol=1e-8))
    if s.dtype != torch.float32:
        exact &= not torch.allclose(q, (logits / 0.7).softmax(-1), rtol=1e-5, atol=1e-8)
    return exact


def reduced_vocab(s, model, io, device) -> dict:
    subset = torch.randperm(s.vocab - 1, generator=generator(device, 5), device=device)[: s.reduced_vocab].sort().values
    sub = SubsetLogits(io, subset, io.head, s.vocab)
    inside = set(subset.tolist())
    greedy_in = all(set(d.ids.flatten().tolist()) <= inside for d in _drafts(s, model, sub, device)[0])
    temps = torch.full((s.mode_requests,), 0.7, device=device)
    q = QBuffer(s.mode_requests, s.k, s.vocab, device, subset)
    zero_outside = True
    outside = torch.ones(s.vocab, dtype=torch.bool, device=device)
    outside[subset] = False
    for d in _drafts(s, model, sub, device, sample=Sampled(temps, generator(device, 6), q))[0]:
        zero_outside &= bool((d.probs[..., outside] == 0).all()) and set(d.ids.flatten().tolist()) <= inside
    return {"greedy_drafts_in_subset": greedy_in, "sampled_q_zero_outside": zero_outside,
            "passed": greedy_in and zero_outside}


def target_token_io(s, model, io, device) -> dict:
    target = _TargetShaped(io)
    direct, batches = _drafts(s, model, io, device)
    via_target, _ = _drafts(s, model, TargetTokenIO(target), device, batches=batches)
    same = all(torch.equal(a.ids, b.ids) for a, b in zip(via_target, direct))
    return {"drafts_equal_direct_tables": same, "passed": same}


MODES = {"tree_search": tree_search, "adaptive_length": adaptive_length, "sampled": sampled,
         "reduced_vocab": reduced_vocab, "target_token_io": target_token_io}


def run(s: CheckShapes, device: torch.device) -> dict:
    model, io = random_draft(s, device, s.dtype), RandomTokenIO(s, device, s.dtype)
    results = {name: mode(s, model, io, device) for name, mode in MODES.items()}
    return {"modes": results, "passed": all(r["passed"] for r in results.values())}
