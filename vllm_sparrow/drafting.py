"""The drafting strategy an engine drafts with, chosen once when the draft loads.

The one place of the rule: tree search (when configured) drafts every greedy step; otherwise
the chain, whose greedy decode steps replay in CUDA graphs when vLLM captures graphs, except
with adaptive length, whose chain reads each step's confidences to stop once no request would
verify more (the captured step keeps no confidences and always drafts K).
The peers are in draft_step.py (the chain), tree_search.py and draft_graphs.py.
"""

from __future__ import annotations

from .draft_graphs import DecodeGraphs, GraphDrafting
from .draft_step import ChainDrafting, DraftingStrategy, StoppingChainDrafting
from .drafter import SparrowDrafter
from .tree_search import TreeDrafting, TreeSpec


def choose_drafting(drafter: SparrowDrafter, num_draft: int, tree: TreeSpec | None, stop_confidence: float | None,
                    graph_mode: str | None, buckets: list[int]) -> DraftingStrategy:
    """tree: the search's spec (None: chains); stop_confidence: adaptive length's threshold (None:
    off); graph_mode: "capture" (CUDA graphs), "eager" (their static buffers, no capture) or
    None (plain eager), as serving_draft.draft_graph_mode says."""
    if tree is not None:
        return TreeDrafting(tree, stop_confidence is not None)
    if stop_confidence is not None:
        return StoppingChainDrafting(stop_confidence)
    if graph_mode is None:
        return ChainDrafting()
    return GraphDrafting(DecodeGraphs(drafter, num_draft, buckets, capture=graph_mode == "capture"), ChainDrafting())
