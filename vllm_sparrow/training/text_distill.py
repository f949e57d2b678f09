"""Distil a Sparrow draft from a target on its own greedy text continuations (stage-1 loss).

The draft learns: (target state of text token t, embedding of token t+1) -> token t+2 and the
target's state at t+1, under the same anchor + window mask it uses at serve time. Hidden
states are the target's final-layer states after the final norm: what vLLM hands the proposer.
Used to make small drafts that accept something on tiny targets (tests, demos).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..model import SparrowDraftModel
from ..window import WindowSpec


@dataclass
class DistillConfig:
    steps: int = 300
    lr: float = 3e-3
    hidden_loss_weight: float = 0.1
    seed: int = 0


class HFTargetIO:
    """A transformers target's frozen embedding and LM head, as the draft's TokenIO."""

    def __init__(self, hf_model) -> None:
        self.embed_layer = hf_model.get_input_embeddings()
        self.head = hf_model.get_output_embeddings()

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        return self.embed_layer(ids)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.head(hidden)


def load_hf_target(target_dir: str):
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText

    cfg = AutoConfig.from_pretrained(target_dir)
    auto = AutoModelForCausalLM if cfg.architectures[0].endswith("ForCausalLM") else AutoModelForImageTextToText
    return auto.from_pretrained(target_dir, dtype=torch.float32).eval()


@torch.no_grad()
def greedy_streams(hf_model, prompts: list[list[int]], max_new_tokens: int):
    """Target's greedy continuation of each (text-only) prompt, with its final hidden states."""
    streams = []
    for ids in prompts:
        inp = torch.tensor([ids])
        out = hf_model.generate(inp, attention_mask=torch.ones_like(inp), max_new_tokens=max_new_tokens,
                                do_sample=False, pad_token_id=0)
        seq = out[0]  # [n]
        hidden = hf_model(input_ids=seq[None], output_hidden_states=True).hidden_states[-1][0]  # [n, H]
        streams.append((seq.clone(), hidden.float().clone()))
    return streams


def _dense_attend(positions: torch.Tensor, spec: WindowSpec):
    mask = spec.mask(positions, positions)  # [n, n]

    def attend(q, k, v):
        g = q.shape[1] // k.shape[1]
        o = F.scaled_dot_product_attention(
            q.transpose(0, 1), k.repeat_interleave(g, 1).transpose(0, 1),
            v.repeat_interleave(g, 1).transpose(0, 1), attn_mask=mask)
        return o.transpose(0, 1)

    return attend


def distill(draft: SparrowDraftModel, io, streams, cfg: DistillConfig) -> list[float]:
    """Train in place; returns the loss per step."""
    torch.manual_seed(cfg.seed)
    spec = WindowSpec(draft.cfg.anchor_tokens, draft.cfg.window_tokens)
    params = [p for n, p in draft.named_parameters() if not n.startswith(("embed_tokens", "lm_head"))]
    opt = torch.optim.AdamW(params, lr=cfg.lr)
    draft.train()
    losses = []
    for step in range(cfg.steps):
        seq, hidden = streams[step % len(streams)]
        n = seq.shape[0] - 2
        pos = torch.arange(n)
        with torch.no_grad():
            emb = io.embed(seq[1 : n + 1])  # [n, H] token t+1
        y = draft(hidden[:n], emb, pos, _dense_attend(pos, spec))  # [n, H]
        loss = F.cross_entropy(io.logits(y), seq[2 : n + 2])
        loss = loss + cfg.hidden_loss_weight * F.smooth_l1_loss(y, hidden[1 : n + 1])
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    draft.eval()
    return losses
