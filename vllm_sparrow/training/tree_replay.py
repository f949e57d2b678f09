"""Would tree verification pay? Chains, tree-search chains and trees replayed on captured samples.

vLLM (0.32-0.34) verifies chains only, so a tree of drafts can reach it only as one chain. Before
anyone builds tree verification, this measures what it would buy. At every verify point c of a
held-out sample's response (c = the newest verified token), the Sparrow draft proposes, from the
committed text entries 0..c-1 (dense attention under its anchor + window mask, which is what the
serving drafter computes: tests/test_draft_cache_matches_dense_reference.py):

  chain d      its greedy chain of depth d <= max_depth                        (d verified tokens)
  search K     EAGLE-2 search of `search_depth` levels: expand the `topk` best nodes by cumulative
               draft log-probability, `topk` children each, level by level; hand over the best
               path of depth K (K tokens)
  tree N       the N best nodes of that search (a tree: a node never outscores its parent),
               every one verified, as tree attention would      (N verified tokens, search_depth
                                                                 sequential draft forwards)

Greedy: the target accepts a proposed token while it equals the target's greedy choice (the
captured response is the target's own greedy answer), so a chain is accepted up to its first miss
and a tree up to the deepest node on the true continuation.

Sampled (`temperature` T, sample-and-match, which is exact for drafts chosen deterministically as
these are): at each verified node the target samples its next token from p = softmax(logits / T)
and the step goes on if a child of the node holds it. The capture holds the target's states along
its greedy answer only, so p is known on that path alone: a sample that matches a child off the
path counts that token and ends the step there (the continuation's p is not known), which makes
the sampled figures lower bounds, equally so for chains and trees.

Reported like vLLM: mean acceptance length = 1 + accepted tokens per verify step, averaged over
every verify point (the same points for every plan: those with max(max_depth, search_depth) more
tokens of the greedy path after them).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from ..model import SparrowDraftModel
from ..window import WindowSpec


@dataclass
class TreeReplay:
    points: int = 0  # verify points replayed
    chain: dict[int, float] = field(default_factory=dict)  # depth -> accepted tokens, summed
    search: dict[int, float] = field(default_factory=dict)  # depth K -> accepted, best path of the search
    tree: dict[int, float] = field(default_factory=dict)  # nodes N -> accepted, the N best nodes verified
    # Sampled verification at `temperature` (sample-and-match along the captured path): expected
    # accepted tokens, summed (empty when no temperature was asked).
    temperature: float | None = None
    sampled_chain: dict[int, float] = field(default_factory=dict)
    sampled_tree: dict[int, float] = field(default_factory=dict)
    search_depth: int = 0  # levels of the search the trees come from (their sequential draft forwards)
    # How sure the target is of its own answer, whatever the draft: its probability of each
    # response token it chose, summed, and how many. A world whose captions get less predictable
    # at some length lowers every draft's acceptance there; this tells that apart from a draft
    # that loses the video.
    top1_sum: float = 0.0
    top1_tokens: int = 0

    def tau(self, kind: str, size: int) -> float:
        return 1.0 + getattr(self, kind)[size] / self.points if self.points else float("nan")

    @property
    def target_top1(self) -> float:
        """Mean probability the target gave its own greedy choice over every response token."""
        return self.top1_sum / self.top1_tokens if self.top1_tokens else float("nan")


class _Keys:
    """Keys/values of one forward, captured through the draft's attend() hook."""

    def __init__(self, spec: WindowSpec) -> None:
        self.spec = spec
        self.k = self.v = None

    def dense(self, n: int):
        """attend() for a dense pass over entries 0..n-1 (keeps their keys)."""
        pos = torch.arange(n)
        mask = self.spec.mask(pos, pos)

        def attend(q, k, v):  # [n, heads, D], [n, kv, D]
            self.k, self.v = k, v
            g = q.shape[1] // k.shape[1]
            return F.scaled_dot_product_attention(
                q.transpose(0, 1), k.repeat_interleave(g, 1).transpose(0, 1),
                v.repeat_interleave(g, 1).transpose(0, 1), attn_mask=mask.to(q.device)).transpose(0, 1)

        return attend


@torch.no_grad()
def replay_trees(draft: SparrowDraftModel, target, samples, max_depth: int = 8, topk: int = 4,
                 tree_nodes: tuple[int, ...] = (2, 4, 8, 16, 32), search_depth: int | None = None,
                 temperature: float | None = None) -> TreeReplay:
    """samples: captured samples (ShardReader items); target: the target (its embed and logits).
    Chains of depth 1..max_depth; the search (and its trees) runs search_depth levels (default
    max_depth); with `temperature`, the sampled case too."""
    draft.eval()
    search_depth = search_depth or max_depth
    out = TreeReplay(chain={d: 0 for d in range(1, max_depth + 1)},
                     search={d: 0 for d in range(1, search_depth + 1)}, tree={n: 0 for n in tree_nodes},
                     temperature=temperature, search_depth=search_depth)
    if temperature is not None:
        out.sampled_chain = {d: 0.0 for d in range(1, max_depth + 1)}
        out.sampled_tree = {n: 0.0 for n in tree_nodes}
    for sample in samples:
        _replay_sample(draft, target, sample, max_depth, search_depth, topk, tree_nodes, out)
    return out


def _replay_sample(draft, target, sample, max_depth, search_depth, topk, tree_nodes, out: TreeReplay) -> None:
    cfg = draft.cfg
    spec = WindowSpec(cfg.anchor_tokens, cfg.window_tokens)
    is_visual = sample["is_visual"]
    tokens = sample["token_ids"][~is_visual]  # [m] the text stream
    hidden = sample["text_hidden"].float()  # [m, H]
    p = int((~is_visual[: int(sample["prompt_len"])]).sum())  # prompt text tokens
    m = tokens.shape[0]
    logits = target.logits(hidden)  # [m, vocab] the target's scores of the token after each
    top1, greedy = logits.softmax(-1).max(-1)  # [m], [m] the target's choice after each token
    out.top1_sum += float(top1[p - 1 : m - 1].sum())  # entries p-1..m-2 predict the response tokens p..m-1
    out.top1_tokens += m - p
    sampled_p = None if out.temperature is None else (logits / out.temperature).softmax(-1)  # [m, vocab]
    # Every committed entry at once: entry j = (h_j, x_{j+1}) at text index j; causal + window,
    # so the pass over entries 0..c-1 is this pass's prefix.
    keys = _Keys(spec)
    y = draft(hidden[: m - 1], target.embed(tokens[1:m]), torch.arange(m - 1), keys.dense(m - 1))  # [m-1, H]
    kc, vc = keys.k, keys.v  # [m-1, kv, D]
    ahead = max(max_depth, search_depth)
    for c in range(p, m - ahead - 1):
        truth = tokens[c + 1 : c + 1 + ahead].tolist()
        if truth != greedy[c : c + ahead].tolist():
            continue  # the stored response left the target's greedy path (a dataset answer)
        out.points += 1
        root = y[c - 1]  # predicts x_c's state; its logits draft x_{c+1}
        chain = _greedy_chain(draft, target, spec, kc[:c], vc[:c], root, c, max_depth)
        for d in range(1, max_depth + 1):
            out.chain[d] += _matched(chain[:d], truth)
        nodes = _search(draft, target, spec, kc[:c], vc[:c], root, c, search_depth, topk)
        for d in range(1, search_depth + 1):
            at_d = [nd for nd in nodes if len(nd[1]) == d]
            best = max(at_d, key=lambda nd: nd[0])[1] if at_d else []
            out.search[d] += _matched(best, truth)
        ranked = sorted(nodes, key=lambda nd: -nd[0])
        for n in tree_nodes:
            paths = [nd[1] for nd in ranked[:n]]
            out.tree[n] += max((len(pth) for pth in paths if pth == truth[: len(pth)]), default=0)
        if sampled_p is not None:
            on_path = sampled_p[c : c + ahead]  # [ahead, vocab] p at each step along the captured answer
            for d in range(1, max_depth + 1):
                out.sampled_chain[d] += _sampled_accepted(_chain_paths(chain[:d]), on_path, truth)
            for n in tree_nodes:
                out.sampled_tree[n] += _sampled_accepted([nd[1] for nd in ranked[:n]], on_path, truth)


def _chain_paths(chain: list[int]) -> list[list[int]]:
    """A chain as the tree it is: its prefixes."""
    return [chain[: i + 1] for i in range(len(chain))]


def _sampled_accepted(paths: list[list[int]], on_path: torch.Tensor, truth: list[int]) -> float:
    """Expected tokens accepted by sample-and-match from a tree given as its nodes' paths (every
    prefix of a node is a node), with the target's sampling distributions known along `truth`
    only (on_path [len(truth), vocab]). Worked example, chain a b, truth a c: P(accept a) =
    p0(a); a is on the path, so step 2 samples from p1: P(b) = p1(b), off the path, counted and
    ended there: E = p0(a) + p0(a) p1(b)."""
    children: dict[tuple, list[int]] = {}
    for path in paths:
        children.setdefault(tuple(path[:-1]), []).append(path[-1])
    expected, reach, prefix = 0.0, 1.0, ()  # reach: probability the step got to this on-path node
    for depth, true_token in enumerate(truth):
        kids = children.get(prefix)
        if not kids:
            break
        p = on_path[depth]
        expected += reach * float(p[kids].sum())  # a sampled token among the node's children: accepted
        if true_token not in kids:
            break  # only the on-path child's continuation is known
        reach *= float(p[true_token])
        prefix = prefix + (true_token,)
    return expected


def _matched(proposal: list[int], truth: list[int]) -> int:
    n = 0
    for a, b in zip(proposal, truth):
        if a != b:
            break
        n += 1
    return n


def _step(draft, target, spec: WindowSpec, kc, vc, parents: torch.Tensor, toks: torch.Tensor, anc_k, anc_v, c: int):
    """One chained entry for each of R nodes: (parent state [R, H], its token [R]) at text index
    c + d - 1, attending to the committed keys kc/vc [c, kv, D] and its ancestors' [R, d-1, kv, D].
    Returns (states [R, H], own keys [R, kv, D], own values)."""
    R, d = parents.shape[0], anc_k.shape[1] + 1
    q_pos = c + d - 1
    key_pos = torch.arange(c + d)
    visible = key_pos <= q_pos
    if spec.window is not None:
        visible &= (key_pos < spec.anchors) | (key_pos > q_pos - spec.window)
    own = {}

    def attend(q, k, v):  # [R, heads, D], [R, kv, D]
        own["k"], own["v"] = k, v
        keys = torch.cat([kc[None].expand(R, -1, -1, -1), anc_k, k[:, None]], 1)  # [R, c + d, kv, D]
        values = torch.cat([vc[None].expand(R, -1, -1, -1), anc_v, v[:, None]], 1)
        g = q.shape[1] // k.shape[1]
        keys, values = keys.repeat_interleave(g, 2), values.repeat_interleave(g, 2)  # [R, c + d, heads, D]
        o = F.scaled_dot_product_attention(q[:, :, None], keys.transpose(1, 2), values.transpose(1, 2),
                                           attn_mask=visible[None, None, None])  # [R, heads, 1, D]
        return o[:, :, 0]

    states = draft(parents, target.embed(toks), torch.full((R,), q_pos), attend)
    return states, own["k"], own["v"]


def _greedy_chain(draft, target, spec, kc, vc, root, c: int, depth: int) -> list[int]:
    kv, dh = kc.shape[1], kc.shape[2]
    anc_k = anc_v = kc.new_zeros(1, 0, kv, dh)
    state, chain = root[None], []
    for _ in range(depth):
        tok = target.logits(state).argmax(-1)  # [1]
        chain.append(int(tok))
        if len(chain) == depth:
            break
        state, k, v = _step(draft, target, spec, kc, vc, state, tok, anc_k, anc_v, c)
        anc_k, anc_v = torch.cat([anc_k, k[:, None]], 1), torch.cat([anc_v, v[:, None]], 1)
    return chain


def _search(draft, target, spec, kc, vc, root, c: int, depth: int, topk: int) -> list[tuple[float, list[int]]]:
    """EAGLE-2-style search. Returns every generated node as (cumulative log-prob, path)."""
    kv, dh = kc.shape[1], kc.shape[2]
    nodes: list[tuple[float, list[int]]] = []
    # frontier: states [F, H] whose logits give the next level, their paths, scores, ancestor keys
    states, paths, scores = root[None], [[]], torch.zeros(1)
    anc_k = anc_v = kc.new_zeros(1, 0, kv, dh)
    for level in range(depth):
        logp = target.logits(states).log_softmax(-1)  # [F, vocab]
        top_lp, top_tok = logp.topk(topk, -1)  # [F, topk]
        cand = (scores[:, None] + top_lp).flatten()  # [F * topk]
        for i in range(cand.shape[0]):
            nodes.append((float(cand[i]), paths[i // topk] + [int(top_tok.flatten()[i])]))
        if level == depth - 1:
            break
        keep = cand.topk(min(topk, cand.shape[0])).indices  # the best nodes expand next
        parent = keep // topk
        toks = top_tok.flatten()[keep]
        states, k, v = _step(draft, target, spec, kc, vc, states[parent], toks, anc_k[parent], anc_v[parent], c)
        anc_k = torch.cat([anc_k[parent], k[:, None]], 1)
        anc_v = torch.cat([anc_v[parent], v[:, None]], 1)
        paths = [paths[int(pi)] + [int(t)] for pi, t in zip(parent, toks)]
        scores = cand[keep]
    return nodes
