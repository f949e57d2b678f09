"""The drafting strategy an engine drafts with, chosen once when the draft loads.

The one place of the rule: tree search (when configured) drafts every greedy step; otherwise
the chain, whose greedy decode steps replay in CUDA graphs when vLLM captures graphs, except
with adaptive length (it reads each step's confidences, which the captured step does not keep).
The peers are in draft_step.py (the chain), tree_search.py and draft_graphs.py.
"""

from __future__ import annotations

from .draft_graphs import DecodeGraphs, GraphDrafting
from .draft_step import ChainDrafting, DraftingStrategy
from .drafter import SparrowDrafter
from .tree_search import TreeDrafting, TreeSpec


def choose_drafting(drafter: SparrowDrafter, num_draft: int, tree: TreeSpec | None, confidence: bool,
                    graph_mode: str | None, buckets: list[int]) -> DraftingStrategy:
    """tree: the search's spec (None: chains); confidence: keep draft confidences (adaptive
    length); graph_mode: "capture" (CUDA graphs), "eager" (their static buffers, no capture) or
    None (plain eager), as proposer.draft_graph_mode says."""
    if tree is not None:
        return TreeDrafting(tree, confidence)
    chain = ChainDrafting(confidence)
    if graph_mode is None or confidence:
        return chain
    return GraphDrafting(DecodeGraphs(drafter, num_draft, buckets, capture=graph_mode == "capture"), chain)
