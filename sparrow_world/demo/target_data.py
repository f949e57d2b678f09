"""Training batches for the demo target: world clips -> Qwen2.5-VL inputs, exactly as vLLM
will build them at serve time (chat template, pixel patches, M-RoPE positions).

Sequence: <chat prompt with one <|video_pad|> per visual token> <caption tokens> <|im_end|>.
Loss and accuracy cover the caption and the final <|im_end|> only.

Positions follow vLLM's Qwen2.5-VL rule (t, h, w per visual token, t = grid index x seconds per
grid x tokens_per_second; text after the video starts at max + 1). `stretch` pretends the clip
is every stretch-th temporal patch of a clip `stretch` times longer: the content of a long world
clip is its short clip slowed down, so this teaches the positions of 25k-token clips while the
model only ever sees short ones (the paper's targets face the same long-position regime).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..world import WorldConfig, render, sample_scene
from ..world.languages import LANGUAGES, Language
from ..world.render import BACKGROUND
from .vision_aux import token_labels

# Qwen2VLImageProcessor's defaults (OpenAI CLIP mean/std) and patch geometry
MEAN = np.array([0.48145466, 0.4578275, 0.40821073], dtype=np.float32)
STD = np.array([0.26862954, 0.26130258, 0.27577711], dtype=np.float32)
PATCH, TPATCH, MERGE = 14, 2, 2
TOKENS_PER_SECOND = 2  # vision_config.tokens_per_second of the demo target
CONT = "cont"  # a word's second and later tokens


def patchify(frames: np.ndarray) -> tuple[np.ndarray, tuple[int, int, int]]:
    """[T, H, W, 3] uint8 -> pixel_values_videos [gt*gh*gw, 3*2*14*14] float32 and grid
    (gt, gh, gw): the numbers Qwen2VLVideoProcessor gives at native size."""
    T, H, W, _ = frames.shape
    x = ((frames.astype(np.float32) / 255.0 - MEAN) / STD).transpose(0, 3, 1, 2)  # [T, C, H, W]
    gt, gh, gw = T // TPATCH, H // PATCH, W // PATCH
    x = x.reshape(gt, TPATCH, 3, gh // MERGE, MERGE, PATCH, gw // MERGE, MERGE, PATCH)
    x = x.transpose(0, 3, 6, 4, 7, 2, 1, 5, 8)
    return np.ascontiguousarray(x.reshape(gt * gh * gw, 3 * TPATCH * PATCH * PATCH)), (gt, gh, gw)


def token_categories(text: str, offsets: list[tuple[int, int]], language: Language = LANGUAGES["easy"]) -> list[str]:
    """Per caption token: its word's category on the word's first token, CONT on its later ones
    (" c" "ir" "cle"), so accuracy can be scored per word: a word is right when all its tokens
    are (circle and cross share " c"). Scoring tokens one by one made a blank video look 0.8
    accurate on shapes: most pieces follow from the first."""
    if len(text) != len(text.strip()) or "  " in text:
        raise ValueError("a caption has single spaces between words and none at its ends")
    words = text.split()
    starts = np.cumsum([0] + [len(w) + 1 for w in words])  # char start of each word
    word_cats = [language.category(w) for w in words]
    cats, seen = [], set()
    for a, b in offsets:
        piece = text[a:b]
        # a lone-space token belongs to the word after it (" up" is " " "u" "p"; " ," is " " ",")
        first_char = a + len(piece) - len(piece.lstrip()) if piece.strip() else b
        word = int(np.searchsorted(starts, first_char, side="right")) - 1
        cats.append(word_cats[word] if word not in seen else CONT)
        seen.add(word)
    return cats


def word_hits(correct: list[bool], categories: list[str]) -> list[tuple[str, bool]]:
    """(category, right) per word of a caption, from per-token right/wrong: a word is right when
    its first token and every CONT token after it are."""
    words: list[tuple[str, bool]] = []
    for ok, cat in zip(correct, categories):
        if cat == CONT:
            words[-1] = (words[-1][0], words[-1][1] and ok)
        else:
            words.append((cat, ok))
    return words


@dataclass
class Sample:
    pixels: np.ndarray  # [gt*gh*gw, 1176]
    grid: tuple[int, int, int]
    caption_ids: list[int]  # caption tokens + <|im_end|>
    categories: list[str]  # one per caption id
    labels: np.ndarray | None = None  # [visual tokens, 4] what the world drew (vision_aux.py)


def blank_like(sample: Sample) -> Sample:
    """The same caption over a blank clip of the same length (background only)."""
    gt, gh, gw = sample.grid
    frames = np.empty((gt * TPATCH, gh * PATCH, gw * PATCH, 3), np.uint8)
    frames[:] = BACKGROUND
    return Sample(patchify(frames)[0], sample.grid, sample.caption_ids, sample.categories)


class WorldBatches:
    """Builds model inputs from world scenes with the demo target's tokenizer."""

    def __init__(self, tokenizer, chat_prompt: str, language: Language = LANGUAGES["easy"]):
        self.tok = tokenizer
        self.language = language
        pad = "<|video_pad|>"
        if chat_prompt.count(pad) != 1:
            raise ValueError("the chat prompt must hold exactly one <|video_pad|>")
        before, after = chat_prompt.split(pad)
        self.before = tokenizer(before, add_special_tokens=False)["input_ids"]
        self.after = tokenizer(after, add_special_tokens=False)["input_ids"]
        self.pad_id = tokenizer.convert_tokens_to_ids(pad)
        self.end_id = tokenizer.convert_tokens_to_ids("<|im_end|>")
        self.fill_id = tokenizer.convert_tokens_to_ids("<|endoftext|>")

    def sample(self, seed: int, cfg: WorldConfig) -> Sample:
        scene = sample_scene(seed, cfg)
        pixels, grid = patchify(render(scene))
        text = self.language.caption(scene)
        enc = self.tok(text, add_special_tokens=False, return_offsets_mapping=True)
        cats = token_categories(text, enc["offset_mapping"], self.language)
        return Sample(pixels, grid, enc["input_ids"] + [self.end_id], cats + ["end"], token_labels(scene))

    def positions(self, grid, n_text_after: int, stretch: float) -> torch.Tensor:
        """vLLM-style M-RoPE positions [3, L] for before + video + after + caption."""
        gt, gh, gw = grid
        lh, lw = gh // MERGE, gw // MERGE
        k = len(self.before)
        text0 = torch.arange(k).view(1, -1).expand(3, -1)
        g = torch.round(torch.arange(gt, dtype=torch.float64) * stretch).long()
        t = (g * TOKENS_PER_SECOND).view(-1, 1, 1).expand(gt, lh, lw).flatten()  # 1 s per grid
        h = torch.arange(lh).view(1, -1, 1).expand(gt, lh, lw).flatten()
        w = torch.arange(lw).view(1, 1, -1).expand(gt, lh, lw).flatten()
        vis = torch.stack([t, h, w]) + k
        start = int(vis.max()) + 1
        rest = torch.arange(start, start + n_text_after).view(1, -1).expand(3, -1)
        return torch.cat([text0, vis, rest], 1)

    def batch(self, samples: list[Sample], stretch: float = 1.0):
        """-> (model kwargs, labels [B, L] with -100 off the caption, prefix length)."""
        grid = samples[0].grid
        if any(s.grid != grid for s in samples):
            raise ValueError("a batch needs clips of one length")
        n_vis = grid[0] * grid[1] * grid[2] // (MERGE * MERGE)
        prefix = self.before + [self.pad_id] * n_vis + self.after
        P = len(prefix)
        L = P + max(len(s.caption_ids) for s in samples)
        B = len(samples)
        ids = torch.full((B, L), self.fill_id, dtype=torch.long)
        labels = torch.full((B, L), -100, dtype=torch.long)
        attn = torch.zeros((B, L), dtype=torch.long)
        for b, s in enumerate(samples):
            n = P + len(s.caption_ids)
            ids[b, :n] = torch.tensor(prefix + s.caption_ids)
            labels[b, P:n] = torch.tensor(s.caption_ids)
            attn[b, :n] = 1
        pos = self.positions(grid, L - len(self.before) - n_vis, stretch)
        kw = dict(input_ids=ids, attention_mask=attn,
                  position_ids=pos.unsqueeze(1).expand(3, B, L).contiguous(),
                  pixel_values_videos=torch.from_numpy(np.concatenate([s.pixels for s in samples])),
                  video_grid_thw=torch.tensor([grid] * B),
                  mm_token_type_ids=(ids == self.pad_id).int() * 2)
        return kw, labels, P
