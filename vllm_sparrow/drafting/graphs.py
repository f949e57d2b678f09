"""The decode draft step as one CUDA graph per batch bucket and depth (GraphDrafting, a drafting strategy: drafting/step.py).

A decode step (every request decoding: the drafter's commit_rows, then k greedy chained
forwards) has fixed shapes for a batch size B, a depth k and L = K + 1 rows per request (K the
deepest depth the engine may schedule: the rows verify the previous step's drafts, whatever
depth those had), and reads nothing back to the host, so it is captured once per (bucket of
batch sizes, depth) and replayed: one graph launch instead of ~250 kernel launches. The depths
are those the engine's schedule can ask for (vLLM's num_speculative_tokens_per_batch_size,
plus K), as vLLM captures its own drafter's graphs per depth; a step of depth k costs k
forwards, not K. Per step the host only copies the inputs into static buffers:

    slots      [Bmax]          cache slot per request; a bucket's padding requests use the
                               sink slot, which only padding reads and writes
    hidden     [Bmax * L, H]   the target's states laid out [B, L] (row b * L + u)
    tokens     [Bmax * L]      their token ids, same layout
    num_valid, seq_start, next_token  [Bmax]

Rows past a request's accepted ones keep whatever an earlier step left there: finite values
that are masked out (never keys, never written to a real slot, outputs discarded).

Captured when the draft loads (serving_draft.py calls the strategy's capture()), before vLLM
profiles memory, so the graphs' private pool is counted with the model's memory and not taken
out of the KV cache vLLM sized; largest bucket first so smaller ones share its memory pool.
With `capture=False` the same static-buffer step runs eagerly, on any device: that is how CPU
tests check the padding and buffer logic that the graphs replay.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .chain import ChainDrafting
from .step import DecodeCore, Drafts, Plain, Sampler, StepBatch, greedy


_CHAIN = ChainDrafting()  # the greedy chain the graphs capture


def default_buckets(max_batch: int) -> list[int]:
    """1, 2, 4, 8, then multiples of 16, up to max_batch (capped at 256 requests)."""
    top = min(max_batch, 256)
    sizes = [b for b in (1, 2, 4, 8) if b <= top] + list(range(16, top + 1, 16))
    return sorted(set(sizes + [top]))


class DecodeGraphs:
    def __init__(self, drafter: DecodeCore, num_draft: int, buckets: list[int], capture: bool,
                 depths: tuple[int, ...] = (), sample: Sampler = greedy) -> None:
        """num_draft: K, the deepest depth; depths: the others the engine may schedule (1..K);
        sample: the greedy sampler the graphs replay (one that also records each position's
        confidence for the runner, v2_runner/confidences.py, must use static buffers only)."""
        d = drafter
        self.drafter, self.num_draft, self.L = d, num_draft, num_draft + 1
        self.depths = sorted({k for k in depths if 1 <= k <= num_draft} | {num_draft})
        self.sample = sample
        self.buckets = sorted(set(buckets))
        self.capture_enabled = capture
        Bmax, L, dev = self.buckets[-1], self.L, d.device
        self.sink = d.cache.num_slots
        long = dict(dtype=torch.long, device=dev)
        self.slots = torch.full((Bmax,), self.sink, **long)
        self.hidden = torch.zeros(Bmax * L, d.hidden_size, dtype=d.dtype, device=dev)
        self.tokens = torch.zeros(Bmax * L, **long)
        self.num_valid = torch.ones(Bmax, **long)  # >= 1 for padding too: it indexes row nv - 1
        self.seq_start = torch.zeros(Bmax, **long)
        self.next_token = torch.zeros(Bmax, **long)
        self.graphs: dict[tuple[int, int], torch.cuda.CUDAGraph] = {}  # (bucket, depth) -> graph
        self.out: dict[tuple[int, int], torch.Tensor] = {}  # (bucket, depth) -> static draft ids [bucket, depth]
        self.replays = 0  # steps served by this path (tests, logs)

    def bucket(self, batch_size: int) -> int | None:
        for b in self.buckets:
            if b >= batch_size:
                return b
        return None

    def _step(self, b: int, depth: int) -> torch.Tensor:
        """The captured body: one decode step of bucket b on the static buffers -> [b, depth]."""
        d, L = self.drafter, self.L
        committed = d.commit_rows(self.slots[:b], self.hidden[: b * L], self.tokens[: b * L].view(b, L),
                                  self.num_valid[:b], self.seq_start[:b], self.next_token[:b])
        return _CHAIN.draft(d, committed, depth, self.sample).ids

    @torch.inference_mode()
    def capture(self) -> None:
        """Capture every bucket (CUDA). Slots are all the sink here, so warm-up and capture
        touch no request's state."""
        if not self.capture_enabled or self.graphs:
            return
        torch.cuda.synchronize()
        pool = torch.cuda.graph_pool_handle()
        for b in reversed(self.buckets):
            for k in reversed(self.depths):
                side = torch.cuda.Stream()
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):  # compile Triton kernels, size cuBLAS workspaces
                    for _ in range(2):
                        self._step(b, k)
                torch.cuda.current_stream().wait_stream(side)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool):
                    self.out[b, k] = self._step(b, k)
                self.graphs[b, k] = graph
        torch.cuda.synchronize()

    def covers(self, batch: StepBatch, depth: int) -> bool:
        """Whether a step of this batch at this depth replays a graph: every request decodes with
        at most K + 1 rows, the depth is one of the captured ones, a bucket holds the batch."""
        return (depth in self.depths and batch.fits_decode_layout(self.num_draft)
                and self.bucket(len(batch.req_ids)) is not None)

    def run(self, batch: StepBatch, slot_list: list[int], depth: int | None = None) -> torch.Tensor:
        """One decode step through the (bucket, depth) graph (or eagerly on the static buffers)
        -> [B, depth] (depth None: K)."""
        depth = self.num_draft if depth is None else depth
        d, L = self.drafter, self.L
        B = len(slot_list)
        b = self.bucket(B)
        slots, dest = d.decode_indices(batch, slot_list + [self.sink] * (b - B), L)  # padding -> sink
        self.slots[:b].copy_(slots)
        self.hidden[dest] = batch.hidden.to(self.hidden.dtype)
        self.tokens[dest] = batch.token_ids
        self.num_valid[:B].copy_(batch.num_valid)
        self.seq_start[:B].copy_(batch.seq_start)
        self.next_token[:B].copy_(batch.next_token)
        self.replays += 1
        if (b, depth) in self.graphs:
            self.graphs[b, depth].replay()
            return self.out[b, depth][:B].clone()  # the static output is overwritten by the next replay
        return self._step(b, depth)[:B]


@dataclass
class GraphDrafting(Plain):
    """The greedy chain, its decode steps through DecodeGraphs (captured, or the same static
    buffers run eagerly); a step the graphs do not cover (prompt chunks, a sampled draft, a
    depth outside the schedule, a batch above the largest bucket) takes `fallback` (commit,
    then chain)."""

    graphs: DecodeGraphs
    fallback: ChainDrafting
    name: str = "chain in CUDA graphs"

    @torch.inference_mode()
    def step(self, drafter: DecodeCore, batch: StepBatch, num_draft: int, sample: Sampler = greedy) -> Drafts:
        g = self.graphs
        if sample is g.sample and g.covers(batch, num_draft):
            return Drafts(g.run(batch, drafter.slots_for(batch.req_ids), depth=num_draft))
        return self.fallback.step(drafter, batch, num_draft, sample)

    def draft(self, drafter: DecodeCore, committed, num_draft: int, sample: Sampler = greedy) -> Drafts:
        return self.fallback.draft(drafter, committed, num_draft, sample)

    def capture(self) -> None:
        self.graphs.capture()

    def describe(self) -> dict:
        steps = "in CUDA graphs" if self.graphs.capture_enabled else "on static buffers"
        return {"drafting": self.name, "tree": None, "decode_steps": steps}
