"""Shared pieces of the spike: word-level tokenizer, Qwen2.5-VL config, batches from the world.

Sequence layout (no chat template):
    <|vision_start|> <|video_pad|> x 128 <|vision_end|> describe what happens in this video
    <caption words> <|im_end|>
Loss / accuracy only on the caption words and the final <|im_end|>.
Position ids are computed here vLLM-style (text after the video starts at max(t,h,w)+1),
so a model trained this way is served by vLLM with the same positions.
"""

from __future__ import annotations

import numpy as np
import torch

from vllm_sparrow.world import WorldConfig, caption, render, sample_scene, vocabulary
from vllm_sparrow.world.render import BACKGROUND
from vllm_sparrow.world.scene import COLOURS, SHAPES, SIZES

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>",
            "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>"]
PROMPT = "describe what happens in this video"
MEAN = np.array([0.48145466, 0.4578275, 0.40821073], dtype=np.float32)
STD = np.array([0.26862954, 0.26130258, 0.27577711], dtype=np.float32)
PATCH, TPATCH, MERGE = 14, 2, 2


def build_vocab() -> dict[str, int]:
    words = vocabulary()
    vocab = {w: i for i, w in enumerate(words)}
    for s in SPECIALS:
        vocab[s] = len(vocab)
    return vocab


def make_hf_tokenizer(vocab: dict[str, int]):
    """PreTrainedTokenizerFast: WordLevel + WhitespaceSplit; specials are whole words."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<|endoftext|>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>",
                                 pad_token="<|endoftext|>", unk_token="<|endoftext|>",
                                 additional_special_tokens=SPECIALS[1:])
    return hf


def make_config(vocab: dict[str, int], hidden=128, layers=2, heads=None, vwidth=64, vdepth=1,
                rope_theta=1e6, head_dim=32):
    from transformers import Qwen2_5_VLConfig

    heads = heads or hidden // head_dim
    half = head_dim // 2
    section = [half // 4, (half - half // 4 + 1) // 2, (half - half // 4) // 2]
    text = dict(vocab_size=len(vocab), hidden_size=hidden, intermediate_size=4 * hidden,
                num_hidden_layers=layers, num_attention_heads=heads,
                num_key_value_heads=max(1, heads // 2), max_position_embeddings=4096,
                bos_token_id=vocab["<|endoftext|>"], eos_token_id=vocab["<|im_end|>"],
                pad_token_id=vocab["<|endoftext|>"], dtype="float32",
                rope_parameters={"rope_type": "default", "rope_theta": rope_theta,
                                 "mrope_section": section},
                tie_word_embeddings=False)
    vision = dict(depth=vdepth, hidden_size=vwidth, intermediate_size=2 * vwidth,
                  num_heads=max(1, vwidth // 32), in_channels=3, patch_size=PATCH,
                  spatial_merge_size=MERGE, temporal_patch_size=TPATCH, window_size=112,
                  fullatt_block_indexes=[vdepth - 1], out_hidden_size=hidden, tokens_per_second=2)
    return Qwen2_5_VLConfig(text_config=text, vision_config=vision, tie_word_embeddings=False,
                            image_token_id=vocab["<|image_pad|>"],
                            video_token_id=vocab["<|video_pad|>"],
                            vision_start_token_id=vocab["<|vision_start|>"],
                            vision_end_token_id=vocab["<|vision_end|>"])


def patchify(frames: np.ndarray) -> tuple[np.ndarray, tuple[int, int, int]]:
    """(T,H,W,3) uint8 -> pixel_values_videos [gt*gh*gw, 3*2*14*14] float32, grid (gt,gh,gw);
    same numbers as Qwen2VLVideoProcessor at native size (checked in check_patchify.py)."""
    T, H, W, _ = frames.shape
    x = (frames.astype(np.float32) / 255.0 - MEAN) / STD  # T,H,W,C
    x = x.transpose(0, 3, 1, 2)  # T,C,H,W
    gt, gh, gw = T // TPATCH, H // PATCH, W // PATCH
    x = x.reshape(gt, TPATCH, 3, gh // MERGE, MERGE, PATCH, gw // MERGE, MERGE, PATCH)
    x = x.transpose(0, 3, 6, 4, 7, 2, 1, 5, 8)
    return np.ascontiguousarray(x.reshape(gt * gh * gw, 3 * TPATCH * PATCH * PATCH)), (gt, gh, gw)


# word categories for the accuracy breakdown
def categorize(words: list[str]) -> list[str]:
    """Category per caption word: digit/size/colour/shape/region/motion/struct."""
    cats, state = [], None
    for i, w in enumerate(words):
        if w.isdigit():
            cats.append("digit")
        elif w in SIZES:
            cats.append("size")
        elif w in COLOURS:
            cats.append("colour")
        elif w in SHAPES:
            cats.append("shape")
        elif state == "region" and w != ".":
            cats.append("region")
        elif state == "motion" and w != ".":
            cats.append("motion")
        else:
            cats.append("struct")
        if w == "." :
            state = None
        elif i >= 1 and words[i - 1] == "at" and w == "the":
            state = "region"
        elif w == "it":
            state = "motion"
    return cats


CATS = ["digit", "size", "colour", "shape", "region", "motion", "struct", "end"]


class World:
    def __init__(self, vocab, cfg: WorldConfig = WorldConfig()):
        self.vocab, self.cfg = vocab, cfg
        self.n_frames = cfg.duration_s * cfg.fps
        gt, gh, gw = self.n_frames // 2, cfg.height // PATCH, cfg.width // PATCH
        self.grid = (gt, gh, gw)
        self.n_vis = gt * gh * gw // (MERGE * MERGE)
        self.prefix = ([vocab["<|vision_start|>"]] + [vocab["<|video_pad|>"]] * self.n_vis
                       + [vocab["<|vision_end|>"]] + [vocab[w] for w in PROMPT.split()])
        blank = np.empty((self.n_frames, cfg.height, cfg.width, 3), np.uint8)
        blank[:] = BACKGROUND
        self.blank_pixels = patchify(blank)[0]

    def sample(self, seed: int):
        scene = sample_scene(seed, self.cfg)
        words = caption(scene).split()
        pix, _ = patchify(render(scene))
        ids = [self.vocab[w] for w in words] + [self.vocab["<|im_end|>"]]
        cats = categorize(words) + ["end"]
        return pix, ids, cats

    def positions(self, total_len: int) -> torch.Tensor:
        """vLLM-style M-RoPE positions [3, total_len] for the fixed layout."""
        gt, gh, gw = self.grid
        lh, lw = gh // MERGE, gw // MERGE
        interval = 2 * (TPATCH / self.cfg.fps)  # tokens_per_second * second_per_grid
        pos = [torch.zeros(3, 1, dtype=torch.long)]  # <|vision_start|>
        t = (torch.arange(gt) * interval).long().view(-1, 1, 1).expand(gt, lh, lw).flatten()
        h = torch.arange(lh).view(1, -1, 1).expand(gt, lh, lw).flatten()
        w = torch.arange(lw).view(1, 1, -1).expand(gt, lh, lw).flatten()
        pos.append(torch.stack([t, h, w]) + 1)
        start = int(pos[-1].max()) + 1
        rest = total_len - 1 - self.n_vis
        pos.append(torch.arange(start, start + rest).view(1, -1).expand(3, -1))
        return torch.cat(pos, 1)

    def batch(self, samples, blank=False):
        """samples: list of (pix, ids, cats) -> model kwargs, labels [B,L], cats (list)."""
        P = len(self.prefix)
        L = P + max(len(s[1]) for s in samples)
        B = len(samples)
        pad = self.vocab["<|endoftext|>"]
        input_ids = torch.full((B, L), pad, dtype=torch.long)
        labels = torch.full((B, L), -100, dtype=torch.long)
        attn = torch.zeros((B, L), dtype=torch.long)
        cats = []
        for b, (_, ids, c) in enumerate(samples):
            n = P + len(ids)
            input_ids[b, :n] = torch.tensor(self.prefix + ids)
            attn[b, :n] = 1
            # label at position j predicts token j+1; HF shifts internally, so labels=tokens
            labels[b, P:n] = torch.tensor(ids)
            cats.append(c)
        pix = np.concatenate([self.blank_pixels if blank else s[0] for s in samples])
        pos = self.positions(L).unsqueeze(1).expand(3, B, L).contiguous()
        mm = (input_ids == self.vocab["<|video_pad|>"]).int() * 2
        kw = dict(input_ids=input_ids, attention_mask=attn, position_ids=pos,
                  pixel_values_videos=torch.from_numpy(pix),
                  video_grid_thw=torch.tensor([self.grid] * B), mm_token_type_ids=mm)
        return kw, labels, cats
