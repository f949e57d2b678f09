"""What the serving drafter must draft, computed independently of it (test kit).

Written from the method's definition, sharing no code with the drafter, its cache or its
attention backends:
- the window rule, literally (`window_mask`; pinned against hand-written masks in
  tests/test_window_rule_matches_written_out_masks.py);
- a request's text stream: the target's states of its text positions in order (visual
  placeholders of the prompt left out), restarted where vLLM restarts the request's computation
  (preemption, a prefix-cache hit), each state paired with the text token that follows it;
- dense drafting: the training model (SparrowDraftModel) run over the whole stream from scratch,
  then once more for each drafted token, under the window mask;
- `StreamReplay`: the streams rebuilt from the steps vLLM handed the drafter (recorded by
  tests/engine_probe.py), with the visual positions told by the tokenizer's placeholder ids.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache

import torch

# Placeholder tokens each target kind's prompts carry for visual embeddings, by token string (the
# tokenizer gives their ids; the product's targets.py is not asked).
PLACEHOLDER_TOKENS = {"qwen2_5_vl": ("<|image_pad|>", "<|video_pad|>"), "qwen2_vl": ("<|image_pad|>", "<|video_pad|>"),
                      "qwen3_vl": ("<|image_pad|>", "<|video_pad|>"), "llava_onevision": ("<image>", "<video>"),
                      "llama": ()}


def placeholder_ids(kind: str, tokenizer) -> set[int]:
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in PLACEHOLDER_TOKENS[kind]}
    for t, i in ids.items():
        assert tokenizer.convert_ids_to_tokens(i) == t, f"the tokenizer has no {t}"
    return set(ids.values())


@lru_cache(maxsize=16)
def _mask(n: int, anchors: int, window: int | None) -> torch.Tensor:
    m = torch.zeros(n, n, dtype=torch.bool)
    for p in range(n):  # query text index
        for i in range(p + 1):  # key text index
            m[p, i] = i < anchors or window is None or p - i < window
    return m


def window_mask(n: int, anchors: int, window: int | None) -> torch.Tensor:
    """[n, n] True where the query at text index p may read the key at text index i."""
    size = 256
    while size < n:
        size *= 2
    return _mask(size, anchors, window)[:n, :n]


def _attend(mask):
    def attend(q, k, v):  # [N, heads, D], [N, kv_heads, D] x 2
        group = q.shape[1] // k.shape[1]
        out = torch.nn.functional.scaled_dot_product_attention(
            q.transpose(0, 1), k.repeat_interleave(group, 1).transpose(0, 1),
            v.repeat_interleave(group, 1).transpose(0, 1), attn_mask=mask)
        return out.transpose(0, 1)

    return attend


@torch.no_grad()
def dense_draft_logits(model, io, hidden: torch.Tensor, following: list[int], drafts: list[int]) -> torch.Tensor:
    """Draft logits [len(drafts), vocab] of a chain after the stream's entries
    (hidden [n, H] with the text token following each), teacher-forced by `drafts`: chain step s
    sees the drafts before it, whatever they are (so a reference and a served chain that part at
    a near tie are still compared step by step)."""
    cfg = model.cfg
    hs, toks, out = list(hidden.float()), list(following), []
    for s in range(len(drafts)):
        n = len(hs)
        y = model(torch.stack(hs), io.embed(torch.tensor(toks)), torch.arange(n),
                  _attend(window_mask(n, cfg.anchor_tokens, cfg.window_tokens)))
        out.append(io.logits(y[-1:])[0].float())
        hs.append(y[-1])
        toks.append(drafts[s])
    return torch.stack(out) if out else torch.zeros(0)


@dataclass
class RequestStream:
    text: list = field(default_factory=list)  # [(token id, hidden [H])] of committed text positions
    consumed: int = 0  # sequence positions whose states arrived (valid rows)
    restarts: int = 0


@dataclass
class Expected:
    """What the drafter must do for one request in one step."""

    req: str
    row: int  # the request's index in the step's batch
    drafting: bool  # False: its prompt continues (or nothing to draft from): drafts are zeros
    hidden: torch.Tensor | None  # [n, H] the stream's states
    following: list[int]  # [n] the text token after each state (the last: the step's next token)


class StreamReplay:
    """Rebuilds each request's text stream from the recorded steps (engine_probe) and says what
    every step must draft. `prompt_len` and `visual_ids` come from outside the product (the
    outputs' prompt token ids, the tokenizer)."""

    def __init__(self, visual_ids: set[int], prompt_len: dict[str, int]) -> None:
        self.visual_ids, self.prompt_len = visual_ids, prompt_len
        self.streams: dict[str, RequestStream] = {}

    def step(self, rec: dict) -> list[Expected]:
        starts = list(rec["row_start"]) + [len(rec["token_ids"])]
        expected = []
        for b, req in enumerate(rec["req_ids"]):
            key = req.rsplit("-", 1)[0]  # the caller's id (the engine suffixes its own)
            s = self.streams.setdefault(req, RequestStream())
            seq0 = rec["seq_start"][b]
            if seq0 != s.consumed:  # vLLM recomputes from here: what the draft saw is gone
                s.text, s.restarts = [], s.restarts + 1
            for j in range(rec["num_valid"][b]):
                tok = int(rec["token_ids"][starts[b] + j])
                if tok in self.visual_ids and seq0 + j < self.prompt_len[key]:
                    continue  # a visual placeholder of the prompt
                s.text.append((tok, rec["hidden"][starts[b] + j]))
            s.consumed = seq0 + rec["num_valid"][b]
            drafting = not rec["mid_prefill"][b] and len(s.text) > 0
            hidden = torch.stack([h for _, h in s.text]) if drafting else None
            following = [t for t, _ in s.text[1:]] + [int(rec["next_token"][b])]
            expected.append(Expected(key, b, drafting, hidden, following))
        return expected

    def committed(self, req: str, mid_prefill: bool = False) -> int:
        """Entries the request's stream holds: each state with its following token known."""
        s = self.streams[req]
        return len(s.text) - (1 if mid_prefill and s.text else 0)


def check_engine_drafts(steps: list[dict], replay: StreamReplay, model, io, atol: float = 1e-3,
                        only: set[int] | None = None) -> dict:
    """Every recorded step's draft logits and ids against the dense reference (or the steps whose
    index is in `only`; every step still feeds the streams). Returns counts (steps, drafting rows,
    chain tokens compared, restarts) for the caller's coverage checks."""
    counts = {"steps": 0, "drafting": 0, "tokens": 0, "prefill_rows": 0}
    for i, rec in enumerate(steps):
        counts["steps"] += 1
        expected = replay.step(rec)
        if only is not None and i not in only:
            continue
        for e in expected:
            drafts = rec["drafts"][e.row]
            if not e.drafting:
                counts["prefill_rows"] += 1
                assert all(d == 0 for d in drafts), f"{e.req}: drafts {drafts} for a request still in its prompt"
                continue
            ref = dense_draft_logits(model, io, e.hidden, e.following, drafts)
            got = torch.stack([step[e.row] for step in rec["logits"]]).float()
            assert torch.allclose(got, ref, atol=atol), (
                f"{e.req} at step {counts['steps'] - 1} ({len(e.following)} entries): draft logits differ from the "
                f"dense reference by {(got - ref).abs().max():.2e}; drafts {drafts}, reference argmax "
                f"{ref.argmax(-1).tolist()}")
            assert [int(g.argmax()) for g in got] == list(drafts)  # greedy: the drafts are those logits' argmax
            counts["drafting"] += 1
            counts["tokens"] += len(drafts)
    counts["restarts"] = sum(s.restarts for s in replay.streams.values())
    return counts
