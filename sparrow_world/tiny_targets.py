"""Tiny random target models, built offline on disk, for CPU tests of vllm-sparrow.

``build_tiny_target(kind, out_dir)`` writes a complete Hugging Face model folder (config.json,
float32 safetensors, a freshly trained byte-level BPE tokenizer, processor/preprocessor configs,
chat_template.jinja) that loads with no network in ``transformers`` (``AutoProcessor``,
``*ForConditionalGeneration``) and in ``vllm.LLM(model=out_dir, ...)`` (vLLM 0.32 CPU build).
A build takes 0.05-0.5 s once torch/transformers are imported; same arguments give
byte-identical weights.

Why these shapes: vLLM's CPU attention only supports head_dim in {32, 64, 80, 96, 112, 128},
so the language model uses head_dim 32 (hidden 128 -> 4 query heads, 2 KV heads: GQA on
purpose); Qwen's M-RoPE sections must sum to head_dim / 2 ([4, 6, 6]). Vision towers are 2
blocks of width 64.

All kinds share one tokenizer of 512 tokens (502 byte-level BPE + 10 specials), so these ids
hold for every kind (``special_token_ids()`` returns them by name). ``corpus`` trains the BPE on
more text (the hard world's captions: its words become single tokens, as common words are in a
real tokenizer); the special ids stay:

    <|endoftext|> 502 (pad, bos_token_id)   <|im_start|> 503     <|im_end|> 504 (eos)
    <|vision_start|> 505    <|vision_end|> 506    <|vision_pad|> 507 (unused)
    <|image_pad|> 508, <|video_pad|> 509: Qwen2-VL/2.5-VL/3-VL image/video placeholders
    <image> 510, <video> 511: LLaVA-OneVision image/video placeholders

Visual placeholder tokens in vLLM per 112x112 input (one token per merged patch):

    kind             image  video 4 frames  video 16 frames
    qwen2_5_vl         16        32             128
    qwen2_vl           16        32             128
    qwen3_vl           16        32             128   (frames resized to 128x128, plus a
                                                       "<t seconds>" text per 2 frames)
    llava_onevision   136        65             257   (16 pooled per frame + 1 newline)

Prompting (``make_prompt`` renders the chat template)::

    prompt = make_prompt(kind, model_dir, "What happens?", media="video")
    frames, meta = decode_video(clip, num_frames=8)   # vllm_sparrow.video; (T, H, W, 3) uint8
    llm.generate({"prompt": prompt, "multi_modal_data": {"video": (frames, meta)}}, params)

- Qwen kinds: the template renders a video part as ``<|vision_start|><|video_pad|><|vision_end|>``
  (images: ``<|image_pad|>``); vLLM expands the single pad to one per visual token.
  Qwen2.5-VL and Qwen3-VL require the metadata dict (Qwen2-VL ignores it): always pass
  ``(frames, metadata)``.
- LLaVA-OneVision: llava-hf's template, ``<|im_start|>user <video>\n{text}<|im_end|>...``.
- llama: text only, plain ChatML.
- ``llm.chat`` works too (``image_pil`` parts; ``video_url`` with ``file://`` needs
  ``allowed_local_media_path``; vLLM then samples the frames itself).

Cross-checking against transformers 5.19: text and image prompts give token-identical greedy
output in both; so do Qwen3-VL and LLaVA-OneVision videos. Qwen2-VL/Qwen2.5-VL videos differ
because transformers 5.19's ``get_rope_index`` starts the text after a video at
``max(h, w) / merge`` instead of vLLM's (and the original Qwen's) ``max(t, h, w) + 1``; pass
vLLM-style ``position_ids`` to the HF model and the outputs match again.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

from vllm_sparrow.prompts import chat_prompt

TARGET_KINDS: tuple[str, ...] = ("qwen2_5_vl", "qwen2_vl", "qwen3_vl", "llava_onevision", "llama")
VISION_KINDS: tuple[str, ...] = ("qwen2_5_vl", "qwen2_vl", "qwen3_vl", "llava_onevision")

# Order fixes the ids: specials come right after the BPE vocabulary, as in Qwen's tokenizer.
SPECIAL_TOKENS: tuple[str, ...] = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
    "<image>",
    "<video>",
)
BPE_VOCAB_SIZE = 502  # + 10 specials = 512 tokens: small on purpose (statistical tests)

HEAD_DIM = 32  # smallest head size vLLM's CPU attention supports
VISION_WIDTH = 64  # vision tower hidden size: 2 heads of 32
FRAME_SIDE = 112  # native frame side of write_synthetic_clip; gives 4x4 merged patches
# Std of the random weights. HF's default 0.02 makes a 128-wide random model echo its last
# token forever; a wider init lets attention mix the context, so greedy output depends on
# the prompt (and on the pixels) while staying finite in float32.
INIT_RANGE = 0.2

# Byte-level BPE training text: any English does; fixed so the vocabulary is reproducible.
_CORPUS = """The quick brown fox jumps over the lazy dog. A video is a sequence of frames shown one
after another. Each frame is an image made of pixels, and every pixel has a red, green and blue
value. The camera moves slowly across the room while a small red square slides from the left to
the right. A green circle bounces near the top of the picture, and a blue square turns around in
the corner. What is happening in this video? Describe the scene in one short sentence. The model
looks at the pictures and answers the question about what it sees. There are two people walking
in the park. The sun is bright and the sky is clear. Speculative decoding lets a small draft
model guess several tokens, and the large target model checks them all at once. When the guess
is right, many tokens are accepted in a single step, which makes generation faster. Please
answer the question with a few words. Count the number of squares and tell me their colours. In
the first second the square is on the left; in the last second it is on the right side of the
frame. Numbers like 1, 2, 3, 10, 42 and 2025 appear in the text, as do times such as 0.5 seconds
and 12:30. She said: "I think the yellow ball is moving faster than the purple one." He replied
that it was not. You are a helpful assistant. Summarise the video, list the objects, and say
which one moves first.
"""

# Qwen's pre-tokenizer regex (transformers' Qwen2Tokenizer rebuilds exactly this pipeline).
_PRETOKENIZE_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)

# Chat templates. Qwen2/2.5-VL: the Instruct checkpoints' template (default system prompt).
_QWEN2_VL_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and message['role'] != 'system' %}"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
    "<|im_start|>{{ message['role'] }}\n{% if message['content'] is string %}"
    "{{ message['content'] }}<|im_end|>\n{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
    "<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif content['type'] == 'video' or 'video' in content or 'video_url' in content %}"
    "<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}{% endfor %}<|im_end|>\n"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# Qwen3-VL: same placeholders, no default system prompt (tools/thinking parts left out).
_QWEN3_VL_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
    "<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif content['type'] == 'video' or 'video' in content or 'video_url' in content %}"
    "<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}{% endfor %}{% endif %}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# LLaVA-OneVision: llava-hf's template (role + space, all images, all videos, then each text
# part on its own line; no newline after <|im_end|>), plus plain-string content.
_LLAVA_OV_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }} "
    "{% if message['content'] is string %}\n{{ message['content'] }}{% else %}"
    "{% for content in message['content'] %}{% if content['type'] in ('image', 'image_url') %}"
    "<image>{% endif %}{% endfor %}"
    "{% for content in message['content'] %}{% if content['type'] in ('video', 'video_url') %}"
    "<video>{% endif %}{% endfor %}"
    "{% for content in message['content'] %}{% if content['type'] == 'text' %}"
    "\n{{ content['text'] }}{% endif %}{% endfor %}{% endif %}"
    "<|im_end|>{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# Text-only ChatML.
_CHATML_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for content in message['content'] %}{% if content['type'] == 'text' %}"
    "{{ content['text'] }}{% endif %}{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
CHAT_TEMPLATES: dict[str, str] = {
    "qwen2_5_vl": _QWEN2_VL_TEMPLATE,
    "qwen2_vl": _QWEN2_VL_TEMPLATE,
    "qwen3_vl": _QWEN3_VL_TEMPLATE,
    "llava_onevision": _LLAVA_OV_TEMPLATE,
    "llama": _CHATML_TEMPLATE,
}


def special_token_ids() -> dict[str, int]:
    """Id of each special token; the same for every kind (one shared tokenizer)."""
    return {tok: BPE_VOCAB_SIZE + i for i, tok in enumerate(SPECIAL_TOKENS)}


def build_tiny_target(
    kind: str,
    out_dir: str | Path,
    *,
    seed: int = 0,
    hidden_size: int = 128,
    num_layers: int = 2,
    vocab_extra: int = 0,
    init_range: float | None = None,
    corpus: str = "",
) -> Path:
    """Write a tiny random ``kind`` model folder to ``out_dir`` and return its path.

    ``init_range`` overrides the weights' init std (default INIT_RANGE = 0.2: large on purpose, so
    a random model's greedy text is decisive; 0.02, the usual value, for models to be trained).
    ``vocab_extra`` adds embedding rows that no token maps to (real checkpoints pad their
    vocabulary the same way); ``hidden_size`` must be a multiple of 32 (head_dim 32).
    Same arguments -> byte-identical weights.
    """
    if kind not in TARGET_KINDS:
        raise ValueError(f"unknown kind {kind!r}; expected one of {TARGET_KINDS}")
    if hidden_size % HEAD_DIM or hidden_size < HEAD_DIM:
        raise ValueError(f"hidden_size must be a multiple of {HEAD_DIM}, got {hidden_size}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)

    tokenizer = _make_tokenizer(kind, corpus)
    config = _make_config(kind, len(tokenizer) + vocab_extra, hidden_size, num_layers)
    if init_range is not None:
        config.initializer_range = init_range
        for sub in ("text_config", "vision_config"):
            if hasattr(config, sub):
                getattr(config, sub).initializer_range = init_range
    _save_random_weights(kind, config, out, seed, len(tokenizer))
    _save_processor(kind, tokenizer, out)
    return out


def make_prompt(
    kind: str,
    tokenizer_or_dir: Any,
    text: str,
    media: Literal["video", "image"] | None = None,
) -> str:
    """One-turn chat prompt string for ``llm.generate`` with ``media`` placed before ``text``.

    ``tokenizer_or_dir`` is a loaded tokenizer/processor (anything with
    ``apply_chat_template``) or a model folder written by ``build_tiny_target``.
    """
    if media is not None and kind not in VISION_KINDS:
        raise ValueError(f"kind {kind!r} is text-only; media={media!r} is not supported")
    templater = tokenizer_or_dir
    if isinstance(tokenizer_or_dir, (str, Path)):
        templater = _load_tokenizer(str(tokenizer_or_dir))
    return chat_prompt(templater, text, media, CHAT_TEMPLATES[kind])


@lru_cache(maxsize=8)
def _load_tokenizer(model_dir: str) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir)


# --------------------------------------------------------------------------- tokenizer


@lru_cache(maxsize=2)
def _bpe_vocab_and_merges(corpus: str = "") -> tuple[dict[str, int], list[tuple[str, str]]]:
    """Train the byte-level BPE on _CORPUS plus `corpus`, once per process and corpus
    (deterministic; ~30 ms)."""
    from tokenizers import Regex, Tokenizer, models, normalizers, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(_PRETOKENIZE_REGEX), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    trainer = trainers.BpeTrainer(
        vocab_size=BPE_VOCAB_SIZE,
        min_frequency=1,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # every byte encodable
    )
    tok.train_from_iterator([_CORPUS + corpus], trainer=trainer)
    model = json.loads(tok.to_str())["model"]
    vocab: dict[str, int] = model["vocab"]
    if len(vocab) != BPE_VOCAB_SIZE:  # the corpus must be rich enough for all merges
        raise RuntimeError(f"BPE training gave {len(vocab)} tokens, wanted {BPE_VOCAB_SIZE}")
    return vocab, [tuple(m) for m in model["merges"]]


def _make_tokenizer(kind: str, corpus: str = "") -> Any:
    """Qwen2Tokenizer over the trained BPE, with the shared special tokens appended."""
    from transformers import Qwen2Tokenizer

    vocab, merges = _bpe_vocab_and_merges(corpus)
    # Specials go into the BPE vocab itself so their ids are fixed (502..511) whatever order
    # transformers registers them in.
    tokenizer = Qwen2Tokenizer(
        vocab={**vocab, **special_token_ids()},
        merges=list(merges),
        unk_token=None,
        bos_token=None,
        eos_token="<|im_end|>",  # chat models stop at the end of the assistant turn
        pad_token="<|endoftext|>",
        model_max_length=32768,
    )
    tokenizer.add_special_tokens({"additional_special_tokens": list(SPECIAL_TOKENS)})
    got = {t: tokenizer.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS}
    if got != special_token_ids():
        raise RuntimeError(f"special token ids moved: {got}")
    tokenizer.chat_template = CHAT_TEMPLATES[kind]
    return tokenizer


# --------------------------------------------------------------------------- configs


def _text_kwargs(vocab_size: int, hidden_size: int, num_layers: int) -> dict[str, Any]:
    ids = special_token_ids()
    heads = hidden_size // HEAD_DIM
    return dict(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=heads,
        num_key_value_heads=max(1, heads // 2),  # GQA whenever there are >= 2 heads
        head_dim=HEAD_DIM,
        max_position_embeddings=32768,
        initializer_range=INIT_RANGE,
        bos_token_id=ids["<|endoftext|>"],
        eos_token_id=ids["<|im_end|>"],
        pad_token_id=ids["<|endoftext|>"],
        dtype="float32",
    )


def _mrope(theta: float, **extra: Any) -> dict[str, Any]:
    # M-RoPE splits the head_dim/2 rotary frequencies into (t, h, w) sections.
    half = HEAD_DIM // 2
    section = [half // 4, (half - half // 4 + 1) // 2, (half - half // 4) // 2]  # 32 -> [4, 6, 6]
    return {"rope_type": "default", "rope_theta": theta, "mrope_section": section, **extra}


def _make_config(kind: str, vocab_size: int, hidden_size: int, num_layers: int) -> Any:
    text = _text_kwargs(vocab_size, hidden_size, num_layers)
    ids = special_token_ids()
    qwen_ids = dict(
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
    )
    vision_common = dict(
        depth=2,
        num_heads=VISION_WIDTH // HEAD_DIM,
        in_channels=3,
        spatial_merge_size=2,
        temporal_patch_size=2,
        initializer_range=INIT_RANGE,
    )
    if kind == "qwen2_5_vl":
        from transformers import Qwen2_5_VLConfig

        vision = dict(
            vision_common,
            hidden_size=VISION_WIDTH,
            intermediate_size=2 * VISION_WIDTH,
            patch_size=14,
            window_size=FRAME_SIDE,  # windows of 112 px = 4x4 merged patches
            fullatt_block_indexes=[1],  # block 0 windowed, block 1 full attention
            out_hidden_size=hidden_size,  # merger output feeds the LM directly
            tokens_per_second=2,
        )
        text.pop("head_dim")  # Qwen2.5 derives head_dim = hidden / heads
        text_cfg = dict(text, rope_parameters=_mrope(1e6), tie_word_embeddings=False)
        return Qwen2_5_VLConfig(
            text_config=text_cfg, vision_config=vision, tie_word_embeddings=False, **qwen_ids
        )
    if kind == "qwen2_vl":
        from transformers import Qwen2VLConfig

        vision = dict(
            vision_common,
            embed_dim=VISION_WIDTH,
            mlp_ratio=2,
            hidden_size=hidden_size,  # Qwen2-VL names the merger's output width hidden_size
            patch_size=14,
        )
        text.pop("head_dim")
        text_cfg = dict(text, rope_parameters=_mrope(1e6), tie_word_embeddings=False)
        return Qwen2VLConfig(
            text_config=text_cfg, vision_config=vision, tie_word_embeddings=False, **qwen_ids
        )
    if kind == "qwen3_vl":
        from transformers import Qwen3VLConfig

        vision = dict(
            vision_common,
            hidden_size=VISION_WIDTH,
            intermediate_size=2 * VISION_WIDTH,
            hidden_act="gelu_pytorch_tanh",
            patch_size=16,
            out_hidden_size=hidden_size,
            num_position_embeddings=64,  # 8x8 learned grid, interpolated to any frame size
            deepstack_visual_indexes=[0],  # one deepstack feature, added after LM layer 0
        )
        text_cfg = dict(
            text, rope_parameters=_mrope(5e6, mrope_interleaved=True), tie_word_embeddings=False
        )
        return Qwen3VLConfig(
            text_config=text_cfg, vision_config=vision, tie_word_embeddings=False, **qwen_ids
        )
    if kind == "llava_onevision":
        from transformers import LlavaOnevisionConfig

        vision = dict(
            model_type="siglip_vision_model",
            hidden_size=VISION_WIDTH,
            intermediate_size=2 * VISION_WIDTH,
            num_hidden_layers=2,
            num_attention_heads=VISION_WIDTH // HEAD_DIM,
            image_size=FRAME_SIDE,
            patch_size=14,  # 8x8 patches per 112 px tile; videos pool them to 4x4
            vision_use_head=False,
        )
        text.pop("head_dim")
        text_cfg = dict(text, model_type="qwen2", tie_word_embeddings=False)
        return LlavaOnevisionConfig(
            text_config=text_cfg,
            vision_config=vision,
            image_token_index=ids["<image>"],
            video_token_index=ids["<video>"],
            vision_feature_select_strategy="full",
            vision_feature_layer=-1,
            image_grid_pinpoints=_LLAVA_PINPOINTS,
            vision_aspect_ratio="anyres_max_9",
            tie_word_embeddings=False,
            initializer_range=INIT_RANGE,
        )
    from transformers import LlamaConfig

    rope = {"rope_type": "default", "rope_theta": 1e4}
    return LlamaConfig(**text, tie_word_embeddings=True, rope_parameters=rope)  # tied on purpose


_LLAVA_PINPOINTS = [[FRAME_SIDE * h, FRAME_SIDE * w] for h in (1, 2) for w in (1, 2)]


# --------------------------------------------------------------------------- weights


def _model_class(kind: str) -> Any:
    import transformers

    return getattr(
        transformers,
        {
            "qwen2_5_vl": "Qwen2_5_VLForConditionalGeneration",
            "qwen2_vl": "Qwen2VLForConditionalGeneration",
            "qwen3_vl": "Qwen3VLForConditionalGeneration",
            "llava_onevision": "LlavaOnevisionForConditionalGeneration",
            "llama": "LlamaForCausalLM",
        }[kind],
    )


def _save_random_weights(kind: str, config: Any, out: Path, seed: int, n_tokens: int) -> None:
    import torch
    from transformers.utils import logging as hf_logging

    torch.manual_seed(seed)
    model = _model_class(kind)._from_config(config, dtype=torch.float32)
    # Zero the output rows of tokens a real model would (almost) never emit: random logits are
    # ~N(0, 2.3) over ~500 tokens, so greedy decoding then never picks them while sampling
    # rarely can. Padding rows (vocab_extra) always: they decode to nothing. Specials only when
    # untied (zero rows would blank their input embeddings too): so no early <|im_end|> stop
    # and no placeholder token in greedy outputs.
    silent = list(range(n_tokens, config.get_text_config().vocab_size))
    if not config.tie_word_embeddings:
        silent += list(special_token_ids().values())
    with torch.no_grad():
        model.get_output_embeddings().weight[silent] = 0.0
    bar_was_on = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # no "Writing model shards" noise in test logs
    try:
        model.save_pretrained(out, safe_serialization=True)
    finally:
        if bar_was_on:
            hf_logging.enable_progress_bar()
    if kind == "llava_onevision":
        _nest_siglip_keys(out / "model.safetensors")


def _nest_siglip_keys(path: Path) -> None:
    """Rename ``vision_tower.X`` to ``vision_tower.vision_model.X`` in a LLaVA checkpoint.

    transformers 5 keeps SigLIP's transformer directly under ``vision_tower`` and saves it so;
    vLLM 0.32 (like the released llava-hf checkpoints) expects the ``vision_model`` level and
    rejects the flat names. transformers reads the nested names back fine.
    """
    from safetensors.torch import load_file, save_file

    prefix = "vision_tower."
    tensors = load_file(path)
    renamed = {
        (prefix + "vision_model." + k[len(prefix):] if k.startswith(prefix) else k): v
        for k, v in tensors.items()
    }
    save_file(renamed, path, metadata={"format": "pt"})


# --------------------------------------------------------------------------- processors


def _save_processor(kind: str, tokenizer: Any, out: Path) -> None:
    if kind == "llama":
        tokenizer.save_pretrained(out)
        return
    processor = _make_processor(kind, tokenizer)
    processor.save_pretrained(out)
    # transformers 5 folds these into processor_config.json; write the classic files too so
    # readers that look for preprocessor_config.json (older tools, vLLM helpers) find them.
    processor.image_processor.save_pretrained(out)
    processor.video_processor.save_pretrained(out)


def _make_processor(kind: str, tokenizer: Any) -> Any:
    import transformers as tf

    if kind in ("qwen2_5_vl", "qwen2_vl"):
        # 112x112 stays 112x112 (4x4 merged patches); bigger inputs are scaled down to that area.
        px = {"shortest_edge": 56 * 56, "longest_edge": FRAME_SIDE * FRAME_SIDE}
        image = tf.Qwen2VLImageProcessor(
            size=px, patch_size=14, temporal_patch_size=2, merge_size=2
        )
        # cap_pixels_per_frame=False: today's transformers behaviour, stated to silence its warning.
        video = tf.Qwen2VLVideoProcessor(
            size=px, patch_size=14, temporal_patch_size=2, merge_size=2, cap_pixels_per_frame=False
        )
        cls = tf.Qwen2_5_VLProcessor if kind == "qwen2_5_vl" else tf.Qwen2VLProcessor
        return cls(image_processor=image, video_processor=video, tokenizer=tokenizer,
                   chat_template=CHAT_TEMPLATES[kind])
    if kind == "qwen3_vl":
        side = 128  # patch 16 x merge 2 = 32 px units: 112 rounds to 128 (4x4 merged patches)
        image = tf.Qwen2VLImageProcessor(
            size={"shortest_edge": 64 * 64, "longest_edge": side * side},
            patch_size=16, temporal_patch_size=2, merge_size=2,
            image_mean=[0.5, 0.5, 0.5], image_std=[0.5, 0.5, 0.5],
        )
        # Qwen3-VL's video budget counts pixels over all frames: allow 64 frames at 128x128.
        video = tf.Qwen3VLVideoProcessor(
            size={"shortest_edge": 2 * 64 * 64, "longest_edge": 64 * side * side},
            patch_size=16, temporal_patch_size=2, merge_size=2, cap_pixels_per_frame=False,
        )
        return tf.Qwen3VLProcessor(image_processor=image, video_processor=video,
                                   tokenizer=tokenizer, chat_template=CHAT_TEMPLATES[kind])
    side_px = {"height": FRAME_SIDE, "width": FRAME_SIDE}
    image = tf.LlavaOnevisionImageProcessor(size=side_px, image_grid_pinpoints=_LLAVA_PINPOINTS)
    video = tf.LlavaOnevisionVideoProcessor(size=side_px)
    return tf.LlavaOnevisionProcessor(
        image_processor=image,
        video_processor=video,
        tokenizer=tokenizer,
        num_image_tokens=(FRAME_SIDE // 14) ** 2,
        vision_feature_select_strategy="full",
        vision_aspect_ratio="anyres_max_9",
        chat_template=CHAT_TEMPLATES[kind],
    )
