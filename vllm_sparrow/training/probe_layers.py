"""Find the target layer whose text tokens look hardest at the video: the IVSB layer.

Sparrow's IVSB training feeds the draft visual hidden states taken from an intermediate
target layer. A good choice is the layer where text attends most to visual tokens, so
``probe_layers`` runs the (eager-attention) target on a few samples and measures, per decoder
layer, the attention mass text queries put on visual keys.

Memory: a long video has tens of thousands of tokens, and one layer's attention matrix is
``heads x n x n``. ``output_attentions=True`` would keep every layer's matrix until the forward
ends, so instead a hook on each layer's attention module reduces its weights to one number as
soon as they exist (the same tensors ``output_attentions`` returns, see the test), and the
samples run one at a time.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass

import torch

from ..knobs import knob


@dataclass
class LayerProbe:
    # Per decoder layer (index i is decoder layer i + 1): mean, over the text query positions
    # after the first visual token, of the attention mass on visual keys (summed over visual
    # keys, averaged over heads); each sample's mean counts once.
    text_to_visual: list[float]
    num_samples: int  # samples that had visual tokens followed by text
    # hidden_states index (HF convention): L is the output of decoder layer L, 1..num_layers.
    suggested_layer: int


@dataclass
class ProbeJob:
    """`sparrow probe-layers`: every option is a field here (knobs.py)."""

    target: str = knob(help="target model directory (Hugging Face format)")
    data: str = knob(help="JSONL of samples, as for `sparrow capture`")
    samples: int = knob(8, "samples with media to probe")
    frames: int = knob(16, "frames sampled per video")
    device: str = knob("cpu", "torch device of the target")


def probe_layers(hf_model, inputs: Iterable[dict], visual_token_ids: Collection[int]) -> LayerProbe:
    """Measure text->visual attention per decoder layer over ``inputs`` (processor outputs,
    batch size 1) and suggest the IVSB layer. ``hf_model`` must use eager attention."""
    decoder = hf_model.get_decoder()  # the language model: its layers are the ones to probe
    _require_eager(decoder)
    visual_ids = torch.tensor(sorted({int(t) for t in visual_token_ids}), dtype=torch.long)
    totals: torch.Tensor | None = None  # [layers] sum of per-sample means
    num_samples = 0
    for sample in inputs:
        masses = _probe_sample(hf_model, decoder, sample, visual_ids)  # [layers] or None
        if masses is None:
            continue  # no visual token, or no text after it: nothing to measure
        totals = masses if totals is None else totals + masses
        num_samples += 1
    if totals is None:
        raise ValueError(
            "probe_layers: no sample has visual tokens (ids "
            f"{sorted(int(t) for t in visual_ids)}) followed by text; pass processor outputs of "
            "prompts with an image or video placeholder and some text after it"
        )
    text_to_visual = (totals / num_samples).tolist()
    return LayerProbe(text_to_visual, num_samples, suggest_layer(text_to_visual))


def suggest_layer(text_to_visual: list[float]) -> int:
    """1-based layer with the most text->visual mass, the last layer excluded: its output is
    the final hidden state the draft already gets, so it adds nothing as a visual source."""
    candidates = text_to_visual[:-1] or text_to_visual  # one layer: nothing else to pick
    return 1 + max(range(len(candidates)), key=candidates.__getitem__)


def format_probe(p: LayerProbe) -> str:
    """Per-layer table for the CLI, the suggested layer marked."""
    lines = [f"text->visual attention over {p.num_samples} sample(s)", "layer  mass"]
    for layer, mass in enumerate(p.text_to_visual, start=1):
        mark = "  <- suggested IVSB layer" if layer == p.suggested_layer else ""
        lines.append(f"{layer:>5}  {mass:.4f}{mark}")
    return "\n".join(lines)


def _require_eager(decoder) -> None:
    # sdpa/flash kernels never materialise the attention weights (transformers then returns
    # none, with only a warning), so the probe needs the eager implementation.
    impl = getattr(decoder.config, "_attn_implementation", None)
    if impl != "eager":
        raise ValueError(
            f"probe_layers needs eager attention, but the model uses {impl!r}: load it with "
            'from_pretrained(..., attn_implementation="eager") or call '
            'model.set_attn_implementation("eager") first'
        )


def _probe_sample(hf_model, decoder, sample: dict, visual_ids: torch.Tensor) -> torch.Tensor | None:
    ids = sample["input_ids"]  # [1, n]
    if ids.dim() != 2 or ids.shape[0] != 1:
        raise ValueError(f"probe_layers takes batch-1 samples, got input_ids {tuple(ids.shape)}")
    is_visual = torch.isin(ids[0].cpu(), visual_ids)  # [n]
    if not is_visual.any():
        return None
    first = int(is_visual.nonzero()[0])
    queries = (~is_visual).nonzero()[:, 0]  # [n] text positions
    queries = queries[queries > first]  # [q] only text that can see the visual tokens
    if queries.numel() == 0:
        return None
    return _run_with_hooks(hf_model, decoder, sample, queries, is_visual)  # [layers]


@torch.no_grad()
def _run_with_hooks(hf_model, decoder, sample, queries, is_visual) -> torch.Tensor:
    layers = list(decoder.layers)
    masses: list[torch.Tensor | None] = [None] * len(layers)

    def reducer(i):
        def hook(_module, _args, output):
            weights = output[1]  # [1, heads, n, n] softmax rows (eager returns them)
            if weights is None:
                raise ValueError(f"decoder layer {i} returned no attention weights; use eager attention")
            rows = weights[0][:, queries.to(weights.device)].float()  # [heads, q, n]
            on_visual = rows[..., is_visual.to(weights.device)].sum(-1)  # [heads, q]
            masses[i] = on_visual.mean().cpu()  # [] averaged over heads and text queries
        return hook

    handles = [layer.self_attn.register_forward_hook(reducer(i)) for i, layer in enumerate(layers)]
    try:
        device = hf_model.device
        batch = {k: v.to(device) if torch.is_tensor(v) else v for k, v in sample.items()}
        # No cache and one logit row: the probe only needs the attention weights.
        hf_model(**batch, use_cache=False, logits_to_keep=1)
    finally:
        for h in handles:
            h.remove()
    if any(m is None for m in masses):
        raise RuntimeError("probe_layers: some decoder layers did not run their attention")
    return torch.stack(masses)  # [layers]
