"""Sparrow drafting: hidden-state reuse over a text-only, window-attended draft cache.

Independent of vLLM and of its runners: each runner's glue (v1_runner/proposer.py,
v2_runner/speculator.py) turns an engine step into a `StepBatch` and hands it, with this drafter,
to the drafting strategy chosen when the draft loaded (drafting/: the strategies call the
drafter's commit and forwards, through drafting/step.py's DraftCore; the drafter calls none).

Per request the drafter keeps a text stream. Entry j pairs the target's hidden state of the
j-th text token with the embedding of the text token that follows it (EAGLE-style: "state at
t + token t+1 -> state at t+1"); visual placeholder positions are skipped entirely, so a
video's 25k tokens add nothing to the draft's cache or its per-step work. Entries built from
the target's states are committed; the K-1 entries the draft builds from its own states while
chaining are written past the committed end and overwritten by the next step.

Batched and sync-free: request state lives in device tensors indexed by a slot (the host only
maps request ids to slots), the whole batch goes through every draft forward together, and
nothing is read back to the host. A step where every request decodes is one fixed [B, K + 1]
layout (what CUDA graphs capture); a step that carries prompt chunks packs its rows request
after request, each request bounded by the text rows the host counts, so a 3,000-token prompt
joining 16 decodes projects ~3,000 + 16 x (K + 2) rows, not 17 x 3,000, and runs attention and
the MLP on 17 (each request's last entry: the draft is one layer, and only that entry's output
is read).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from .attention import WindowAttentionBackend
from .drafting.sampling import GREEDY_TEMPERATURE, Sampler, greedy, sampled
from .drafting.step import Committed, DraftingStrategy, Proposal, StepBatch
from .model import SparrowDraftModel, TokenIO
from .serving_layer import SparrowServingLayer
from .window import PackedRows, TextWindowCache, WindowBatch, WindowSpec

__all__ = ["GREEDY_TEMPERATURE", "SparrowDrafter", "StepBatch", "Sampler", "greedy", "sampled"]

COMMITTED, SEEN, HAS_PENDING = 0, 1, 2  # columns of SparrowDrafter.state
RECENT_RELEASED = 1024  # released requests whose text entries stats() still reports (a fixed bound)


def profile_layout(num_tokens: int, num_requests: int, longest: int) -> np.ndarray:
    """Rows per request [B] of the largest step: B = min(num_requests, num_tokens) requests (the
    packed rows are T + B, so as many as there may be), T = num_tokens rows: one long chunk and
    single rows, the chunk split where it is longer than `longest` (the RoPE table: a
    max_num_batched_tokens above max_model_len), never more requests than num_requests.
    Worked example: 10 tokens, 4 requests, longest 4 -> [4, 4, 1, 1] (one chunk of 8 would not fit)."""
    B = max(1, min(num_requests, num_tokens))
    chunks = 1
    while chunks < B and max(num_tokens, B) - (B - chunks) > chunks * longest:
        chunks += 1
    rest = min(max(num_tokens, B) - (B - chunks), chunks * longest)  # rows of the chunks
    sizes = [rest // chunks + (i < rest % chunks) for i in range(chunks)]
    return np.array(sizes + [1] * (B - chunks), dtype=np.int64)


class SparrowDrafter:
    def __init__(
        self,
        model: SparrowDraftModel,
        io: TokenIO,
        visual_token_ids: tuple[int, ...],
        backend: WindowAttentionBackend,
        device: torch.device,
        dtype: torch.dtype,
        max_requests: int = 8,
        max_draft_tokens: int = 8,
        max_text_tokens: int = 1 << 14,
        recent_released: int = RECENT_RELEASED,
    ) -> None:
        cfg = model.cfg
        self.io, self.backend, self.device, self.dtype = io, backend, torch.device(device), dtype
        self.hidden_size = cfg.hidden_size
        # A reduced draft vocabulary (draft_vocab.SubsetLogits): io.logits covers io.ids only.
        self.vocab_ids: torch.Tensor | None = getattr(io, "ids", None)  # [N] column -> token id
        self.max_draft_tokens = max_draft_tokens
        self.layer = SparrowServingLayer(model, max_positions=max_text_tokens + max_draft_tokens + 1)
        self.spec = WindowSpec(cfg.anchor_tokens, cfg.window_tokens)
        self.cache = TextWindowCache(self.spec, max_requests, max_draft_tokens, max_text_tokens,
                                     cfg.num_key_value_heads, cfg.head_dim, dtype, device)
        self.visual_ids = torch.tensor(sorted(visual_token_ids), dtype=torch.long, device=device)
        self._visual_host = frozenset(visual_token_ids)
        # Per-slot request state, on the device (slot max_requests is the cache's sink), packed
        # so a step reads and writes it with one op each: columns COMMITTED (text entries in the
        # cache), SEEN (sequence index consumed), HAS_PENDING (1: `pending` holds a text state
        # whose following token is not known yet: the prompt continues in the next chunk).
        n = max_requests + 1
        self.state = torch.zeros(n, 3, dtype=torch.long, device=device)  # [slots + 1, 3]
        self.state[:, SEEN] = -1
        self.pending = torch.zeros(n, cfg.hidden_size, dtype=dtype, device=device)  # last text state
        self._iota = torch.arange(max(n, max_draft_tokens + 1), device=device)  # cached aranges
        # Host: request id -> slot.
        self.slot_of: dict[str, int] = {}
        self._free = list(range(max_requests - 1, -1, -1))
        # Text entries the last `recent_released` released requests committed, for stats(): a fixed
        # device ring written at release (no host read, no allocation per request) and the host's
        # request id of each of its rows, so a server's memory does not grow with requests served.
        self._recent_entries = torch.zeros(recent_released, dtype=torch.long, device=device)  # [R]
        self._recent_ids: dict[str, int] = {}  # request id -> its row of _recent_entries
        self._recent_owner: list[str | None] = [None] * recent_released  # row -> request id
        self._recent_next = 0

    # ---- request lifecycle ---------------------------------------------------------
    def _slot(self, req_id: str) -> int:
        slot = self.slot_of.get(req_id)
        if slot is None:
            if not self._free:
                raise RuntimeError(
                    f"draft cache: more than {self.cache.num_slots} requests at once; the drafter "
                    "is sized by the engine's max_num_seqs")
            slot = self.slot_of[req_id] = self._free.pop()
            self.state[slot, SEEN] = -1  # a fresh stream (the slot may hold an older request's)
        return slot

    def slots_for(self, req_ids: Sequence[str]) -> list[int]:
        """The cache slot of each request, a free one for a request new to the drafter."""
        return [self._slot(r) for r in req_ids]

    def release(self, req_ids) -> None:
        """Forget requests that finished, were aborted or preempted (their slots go back)."""
        for r in req_ids:
            slot = self.slot_of.pop(r, None)
            if slot is None:
                continue
            self._remember_released(r, slot)
            self._free.append(slot)

    def _remember_released(self, req_id: str, slot: int) -> None:
        """Write the request's committed entries into the next row of the recent ring, the row's
        previous request forgotten."""
        row = self._recent_next
        self._recent_next = (row + 1) % len(self._recent_owner)
        previous = self._recent_owner[row]
        if previous is not None and self._recent_ids.get(previous) == row:
            del self._recent_ids[previous]
        self._recent_owner[row] = req_id
        self._recent_ids[req_id] = row  # a request released again (preempted, then finished): its latest
        self._recent_entries[row] = self.state[slot, COMMITTED]  # a device copy: no sync

    # ---- one engine step -----------------------------------------------------------
    def commit(self, batch: StepBatch, num_draft: int) -> Committed:
        """Commit this step's target states to the requests' slots (the fixed [B, K + 1] layout
        when every request decodes, else packed rows): what every strategy drafts from."""
        if num_draft > self.max_draft_tokens:
            raise ValueError(f"{num_draft} draft tokens asked, the drafter was sized for "
                             f"{self.max_draft_tokens}")
        slot_list = self.slots_for(batch.req_ids)
        # Ring rows that can hold an entry: while no slot of the batch has wrapped, a prefix.
        rows = None if batch.text_bound is None else int(batch.text_bound.max(initial=0))
        # Decode rows verify the previous step's drafts, whose depth need not be this step's
        # (vLLM's per-batch-size schedule): the layout is [B, K + 1], wider where a request
        # verifies more than that.
        width = batch.decode_width()
        L = None if width is None else max(width, num_draft + 1)
        if L is not None and L <= self.max_draft_tokens + 1:
            slots, dest = self.decode_indices(batch, slot_list, L)
            return self._commit_decode(batch, slots, dest, L, rows)
        return self._commit_packed(batch, slot_list, rows)

    @torch.inference_mode()
    def profile_step(self, num_tokens: int, num_requests: int, num_draft: int, drafting: DraftingStrategy,
                     sample: Sampler = greedy) -> int:
        """The largest step vLLM can schedule: num_tokens rows, all text, over num_requests
        requests, drafted on the sink slot the way the engine drafts (its strategy, and a sampler
        that samples every request when it may sample any), so vLLM's memory profile (its dummy
        run before it sizes the KV cache) counts the draft's activations. No request's state is
        touched. Returns the packed rows run."""
        qlen = profile_layout(num_tokens, num_requests, max(1, self.layer.max_positions - self.max_draft_tokens - 2))
        B, T = len(qlen), int(qlen.sum())
        dev, sink = self.device, self.cache.num_slots
        text = next(i for i in range(len(self._visual_host) + 1) if i not in self._visual_host)  # a text token
        z = lambda n, dt=torch.long: torch.zeros(n, dtype=dt, device=dev)  # noqa: E731
        batch = StepBatch([""] * B, z(T) + text, self.pending.new_zeros(T, self.pending.shape[1]),
                          np.concatenate([[0], np.cumsum(qlen)]), torch.as_tensor(qlen, device=dev), z(B),
                          z(B), z(B) + text, z(B, torch.bool), text_rows=qlen)
        drafting.draft(self, self._commit_packed(batch, [sink] * B, None), num_draft, sample)
        self.state[sink] = torch.tensor([0, -1, 0], device=dev)
        return T + B

    def to_device(self, values) -> torch.Tensor:
        """Host integers -> device int64 (pinned, asynchronous on CUDA: no sync)."""
        host = values if isinstance(values, torch.Tensor) else torch.as_tensor(np.asarray(values, dtype=np.int64))
        if self.device.type == "cuda":
            return host.pin_memory().to(self.device, non_blocking=True)
        return host.to(self.device)

    def decode_indices(self, batch: StepBatch, slot_list: list[int], L: int):
        """slots [len(slot_list)] (the batch's, then any padding the caller appends) and dest [T]
        (row of the [B, L] layout each of the step's rows goes to), copied in one transfer."""
        qs = batch.query_start
        row_req = np.repeat(np.arange(len(batch.req_ids)), np.diff(qs))  # [T]
        dev = self.to_device(np.concatenate([slot_list,
                                             row_req * L + np.arange(int(qs[-1])) - qs[:-1][row_req]]))
        return dev[: len(slot_list)], dev[len(slot_list) :]

    def _commit_decode(self, batch: StepBatch, slots, dest, L: int, rows: int | None = None) -> Committed:
        """The commit of a step where every request decodes: its rows are [last token, drafts...],
        all text, the first num_valid of them accepted. Scatters the rows into the [B, L] layout
        (padding rows zero: they must stay finite), then commits."""
        B, H = len(batch.req_ids), batch.hidden.shape[-1]
        hid = self.pending.new_zeros(B * L, H)
        hid[dest] = batch.hidden.to(hid.dtype)
        tok = batch.token_ids.new_zeros(B * L)
        tok[dest] = batch.token_ids
        return self.commit_rows(slots, hid, tok.view(B, L), batch.num_valid, batch.seq_start, batch.next_token,
                                rows)

    def commit_rows(self, slots, hid, tok, nv, seq_start, next_token, rows: int | None = None) -> Committed:
        """The decode commit on a laid-out batch: fixed shapes for a given (B, L), no host read
        (what a CUDA graph captures, drafting/graphs.py).

        slots [B]; hid [B * L, H]; tok [B, L]; nv [B] accepted rows (>= 1: the last sampled
        token's row); seq_start [B]; next_token [B].
        Worked example, L = 4: request b's rows x9 d1 d2 d3 with d1 accepted (nv = 2), next
        token x11 (the target's correction after d1 = x10), 9 entries committed before: entries
        (h9, x10) (h10, x11) get text indices 9 10; rows 2 and 3 are padding. (h9, x10) is
        stored; (h10, x11), the last accepted, attends to entries up to 10 and is finished: its
        output is what request b drafts from.
        """
        B, L = tok.shape
        slot_state = self.state[slots]  # [B, 3]
        fresh = slot_state[:, SEEN] != seq_start  # a request the drafter lost track of: restart
        c0 = torch.where(fresh, 0, slot_state[:, COMMITTED])  # [B]
        row = self._iota[:L]  # [L] row within a request's layout
        following = torch.where(row + 1 < nv[:, None], tok.roll(-1, 1), next_token[:, None])  # [B, L]
        pos = c0[:, None] + row  # [B, L] text index of each row
        # As in a packed step: every row is projected, the accepted rows before the last are
        # stored, and only the last accepted row (the one drafting starts from; the draft is one
        # layer) gets attention and the MLP: B rows instead of B x L.
        x, q, k, v = self.layer.project(hid, self.io.embed(following.reshape(-1)), pos.reshape(-1))  # [B * L, ...]
        self.backend.store(self.cache, WindowBatch(slots, pos, row < (nv - 1)[:, None], c0, rows),
                           k.view(B, L, *k.shape[1:]), v.view(B, L, *v.shape[1:]))
        last_row = (nv - 1).clamp(min=0)  # [B]
        last = self._iota[:B] * L + last_row  # [B] its row of the B x L rows
        p_last = c0 + last_row  # [B] its text index; the cache now holds the entries before it
        wb = WindowBatch(slots, p_last[:, None], (nv > 0)[:, None], p_last, rows)
        attn, ctx = self.backend.commit(self.cache, wb, q.index_select(0, last)[:, None],
                                        k.index_select(0, last)[:, None], v.index_select(0, last)[:, None])
        y_last = self.layer.finish(x.index_select(0, last), attn[:, 0])  # [B, H]
        c_new = c0 + nv
        self.state[slots] = torch.stack([c_new, seq_start + nv, nv * 0], 1)  # nothing pending
        return Committed(y_last, slots, c_new, nv > 0, ctx, rows)

    def _packed_layout(self, batch: StepBatch, slot_list: list[int]):
        """Host indices of a packed step, copied in one transfer: slots [B], row_req [T] (request
        of each of the step's rows), row_off [T] (row within its request), step_starts [B] (first
        step row of each request), cu [B + 1] (host and device: packed rows of each request, an
        upper bound on its text states plus one for a pending state), prow_req [N] and
        prow_off [N] (request of each packed row, row within it)."""
        qs = batch.query_start
        B, T = len(batch.req_ids), int(qs[-1])
        qlen = np.diff(qs)
        text = qlen if batch.text_rows is None else np.minimum(batch.text_rows, qlen)
        cu = np.concatenate([[0], np.cumsum(text + 1)]).astype(np.int64)  # + 1: a pending state
        row_req = np.repeat(np.arange(B), qlen)  # [T]
        prow_req = np.repeat(np.arange(B), np.diff(cu))  # [N]
        host = np.concatenate([slot_list, row_req, np.arange(T) - qs[:-1][row_req], qs[:-1], cu,
                               prow_req, np.arange(cu[-1]) - cu[:-1][prow_req]])
        dev = self.to_device(host)
        e = np.cumsum([B, T, T, B, B + 1, int(cu[-1])])  # ends of the parts
        return (dev[: e[0]], dev[e[0] : e[1]], dev[e[1] : e[2]], dev[e[2] : e[3]], cu,
                dev[e[3] : e[4]], dev[e[4] : e[5]], dev[e[5] :])

    def _commit_packed(self, batch: StepBatch, slot_list: list[int], rows: int | None) -> Committed:
        """Commit this step's new entries, packed (no padding between requests: a step where a
        prompt chunk joins decodes runs on the rows it has, never on B x the chunk's length, and
        reads nothing back to the host); update the slots' state. Every entry is projected and
        stored; attention and the MLP run for each request's last entry only (the one drafting
        starts from).

        Worked example, two requests (V: a visual placeholder row; every row valid):
          request 0: rows x5 V V x6, next token x7, nothing pending, 10 entries committed
          request 1: rows x3 x4, next token x5, h2 pending (its chunk ended before x3 was
                     known), 3 entries committed
        Rows (T = 6):      x5  V   V   x6 | x3  x4
          row_req          0   0   0   0  | 1   1
          is_item          1   0   0   1  | 1   1     text states that count
          csum             1   1   1   2  | 3   4     running count of items
          before = (csum - is_item)[starts] = [0, 2]   items of earlier requests
          hp = [0, 1];  n_items = hp + items = [2, 3]; count = n_items - 1 + 1 = [2, 3]
          rank             0   -   -   1  | 1   2     (request 1's pending h2 takes rank 0)
        Packed rows: the host bounds request 0's text rows by 2 (its 4 rows less 2 placeholders,
        text_rows) and request 1's by 2, plus one each for a pending state: cu = [0, 3, 6];
        dest = cu[row_req] + rank (visual rows go to the dump row 6):
          packed           h5 h6 pad | h2 h3 h4    tokens x5 x6 . | .  x3 x4
          following        x6 x7 .   | x3 x4 x5
        so request 0 commits (h5, x6) (h6, x7) at text indices 10 11 and request 1 commits
        (h2, x3) (h3, x4) (h4, x5) at 3 4 5; each drafts from the output of its last entry
        (packed rows 1 and 5: last = starts + count - 1).
        Had request 1's prompt continued (mid-prefill), x5 would be unknown: h4 would stay
        pending and only 2 entries would be committed.
        """
        slots, row_req, row_off, step_starts, cu, cu_dev, prow_req, prow_off = self._packed_layout(batch, slot_list)
        N = int(cu[-1])
        slot_state = self.state[slots]  # [B, 3]
        fresh = slot_state[:, SEEN] != batch.seq_start  # new, preempted or prefix-cached: restart
        c0 = torch.where(fresh, 0, slot_state[:, COMMITTED])  # [B]
        hp = (slot_state[:, HAS_PENDING] > 0) & ~fresh  # [B] has a pending state

        toks = batch.token_ids  # [T]
        seq = batch.seq_start[row_req] + row_off
        visual = torch.isin(toks, self.visual_ids) & (seq < batch.num_prompt_tokens[row_req])
        is_item = (row_off < batch.num_valid[row_req]) & ~visual  # [T] a text state that counts
        csum = is_item.long().cumsum(0)
        before = (csum - is_item.long())[step_starts]  # [B] items of earlier requests
        starts = cu_dev[:-1]  # [B] first packed row of each request
        n_items = hp.long() + torch.cat([before[1:], csum[-1:]]) - before  # [B] incl. pending
        rank = hp.long()[row_req] + csum - 1 - before[row_req]  # [T]
        nt = ~batch.mid_prefill  # [B] the token after the last item is known
        count = (n_items - 1 + nt.long()).clamp(min=0)  # [B] entries committed this step

        dest = torch.where(is_item, starts[row_req] + rank, N)  # [T] (N: the dump row)
        H = batch.hidden.shape[-1]
        hid = self.pending.new_zeros(N + 1, H)  # padding rows zero: they must stay finite
        hid[torch.where(hp, starts, N)] = self.pending[slots]
        hid[dest] = batch.hidden.to(hid.dtype)
        tok = toks.new_zeros(N + 1)
        tok[dest] = toks
        hid, tok = hid[:N], tok[:N]  # [N, H], [N]
        # Token of the next item, the step's next token after the last (rows of a request are
        # contiguous, so the next packed row is the next item while there is one).
        following = torch.where(prow_off + 1 < n_items[prow_req], tok.roll(-1), batch.next_token[prow_req])
        # Every entry's K/V is stored, but only the last committed entry's output is read (the
        # draft is one layer, and drafting starts from that entry): the packed rows run up to
        # attention, their real rows go to the cache, and the last entry of each request is
        # committed like a decode row, one row per request, attention and MLP included.
        x, q, k, v = self.layer.project(hid, self.io.embed(following), c0[prow_req] + prow_off)  # [N, ...]
        self.backend.store_packed(self.cache, PackedRows(slots, cu, c0, count), k, v)
        last = (starts + count - 1).clamp(min=0, max=N - 1)  # [B] packed row of the last entry
        pos = c0 + (count - 1).clamp(min=0)  # [B] its text index (count 0: a row nothing reads)
        # cache_len = pos: the cache holds the entries before it (the ring row the write gave the
        # last entry reads as an older index, outside its window; the commit rewrites it, same K/V).
        wb = WindowBatch(slots, pos[:, None], (count > 0)[:, None], pos, rows)
        attn, ctx = self.backend.commit(self.cache, wb, q.index_select(0, last)[:, None],
                                        k.index_select(0, last)[:, None], v.index_select(0, last)[:, None])
        y_last = self.layer.finish(x.index_select(0, last), attn[:, 0])  # [B, H]

        # State after this step (slots are distinct within a batch).
        keep_pending = ~nt & (n_items > 0)
        last_item = hid[(starts + n_items - 1).clamp(min=0, max=N - 1)]  # [B, H]
        self.pending[slots] = torch.where(keep_pending[:, None], last_item, self.pending[slots])
        c_new = c0 + count
        self.state[slots] = torch.stack([c_new, batch.seq_start + batch.num_valid, keep_pending.long()], 1)
        return Committed(y_last, slots, c_new, nt & (count > 0), ctx, rows)

    # ---- what drafting strategies draft through (drafting/step.py) --------------------
    def forward(self, hidden, tokens, wb: WindowBatch, attention) -> torch.Tensor:
        """One draft forward over a [B, L] layout; returns [B * L, hidden].
        attention(q [B, L, heads, D], k, v [B, L, kv_heads, D]) -> [B, L, heads, D]."""
        B, L = wb.pos.shape
        heads, kv, d = self.layer.heads, self.layer.kv_heads, self.layer.head_dim

        def attend(q, k, v):  # [B * L, heads | kv_heads, D]
            out = attention(q.view(B, L, heads, d), k.view(B, L, kv, d), v.view(B, L, kv, d))
            return out.reshape(B * L, heads, d)

        embeds = self.io.embed(tokens.reshape(-1))
        return self.layer(hidden.reshape(B * L, -1), embeds, wb.pos.reshape(-1), attend)

    def chain_attention(self, committed: Committed, wb: WindowBatch):
        """The attention of a chained forward at wb: the committed keys the commit gathered,
        plus the chain's own entries (written past the committed end, never read later)."""
        return lambda q, k, v: self.backend.chain(self.cache, committed.chain_ctx, wb, q, k, v)

    def propose(self, y: torch.Tensor, sample: Sampler, confidence: bool = False, position: int = 0) -> Proposal:
        """Draft tokens [B] of chained position `position` (and with `confidence` their
        probability under the draft [B]) from draft states y [B, H]. A sampled draft's
        distribution stays with the sampler's store (drafting/sampling.py)."""
        logits = self.io.logits(y)  # [B, Vd]
        tok, q = sample(logits, position)
        conf = None
        if confidence:  # the drafted token's probability under the draft
            probs = q if q is not None else logits.float().softmax(-1)
            conf = probs.gather(-1, tok[:, None])[:, 0]
        if self.vocab_ids is not None:
            tok = self.vocab_ids[tok]  # subset column -> token id
        return Proposal(tok, q is not None, conf)

    # ---- accounting ----------------------------------------------------------------
    def stats(self) -> dict:
        """Occupancy and per-request text entries (reads device values: tests and benchmarks)."""
        recent = self._recent_entries.tolist()
        entries = {r: recent[row] for r, row in self._recent_ids.items()}
        entries.update({r: int(self.state[s, COMMITTED]) for r, s in self.slot_of.items()})
        return {
            "live_requests": sorted(self.slot_of),
            "slots_in_use": len(self.slot_of),
            "num_slots": self.cache.num_slots,
            "bytes_per_slot": self.cache.bytes_per_slot,
            "cache_bytes": self.cache.nbytes,
            "text_entries": entries,
            "held": self.held(),
        }

    def tracked(self) -> list[str]:
        """The requests that hold a slot now (host only)."""
        return list(self.slot_of)

    def held(self) -> dict[str, int]:
        """How many requests each per-request structure holds (host reads only): slots (live
        requests, at most max_requests) and recent (released requests whose entries stats()
        reports, at most recent_released; a request released twice, preempted and then finished,
        takes a row each time). Nothing else here grows with requests."""
        return {"slots": len(self.slot_of), "recent": len(self._recent_ids)}
