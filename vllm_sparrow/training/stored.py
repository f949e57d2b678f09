"""What capture stores per sample, whichever target computed it (transformers or vLLM): the
response tokens a sample brings, and the tensors kept from its states (capture.py's docstring
lists them). cfg is a capture.CaptureConfig."""

from __future__ import annotations

import torch

from .data import Sample

STORE_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def given_response(target, sample: Sample, cfg) -> list[int] | None:
    """The response tokens a sample brings (its response_ids as they are, or its text tokenized
    and ended as the target ends a turn), or None: the target writes it."""
    if cfg.regenerate or (sample.response is None and sample.response_ids is None):
        return None
    if sample.response_ids is not None:  # the target's own tokens (sparrow respond)
        return list(sample.response_ids)
    return target.response_ids(sample.response)


def stored_tensors(cfg, index: int, visual_ids, token_ids: torch.Tensor, prompt_len: int, final: torch.Tensor,
                   layer: torch.Tensor, aux: torch.Tensor | None, aux_layers: tuple[int, ...]) -> dict[str, torch.Tensor]:
    """What sample `index` stores (capture.py's docstring) from its token ids [n], final states
    [n, H], IVSB layer states [n, H] and EAGLE-3 auxiliary states [n, A * H] (or None)."""
    is_visual = torch.isin(token_ids, torch.tensor(visual_ids, dtype=token_ids.dtype))
    is_visual[prompt_len:] = False  # generated tokens are text whatever their id
    dtype = STORE_DTYPES[cfg.store_dtype]
    tensors = {
        "token_ids": token_ids.long(),  # [n]
        "is_visual": is_visual,  # [n]
        "prompt_len": torch.tensor([prompt_len]),
        "text_hidden": final[~is_visual].to(dtype),  # [n_text, H]
        "visual_hidden": layer[is_visual].to(dtype),  # [n_vis, H]
    }
    kept = ivsb_kept(int(is_visual.sum()), cfg.ivsb_keep, index)
    if kept is not None:
        tensors["visual_hidden"] = tensors["visual_hidden"][kept]  # [n_kept, H]
        tensors["visual_kept"] = kept  # [n_kept] which visual positions those are
    if cfg.eagle3:  # every position, visual ones included, as vLLM hands them to the draft
        tensors["aux_hidden"] = aux.to(dtype)  # [n, A * H]
        tensors["aux_layers"] = torch.tensor(aux_layers)  # [A]
    return tensors


def ivsb_kept(n_vis: int, share: float, index: int) -> torch.Tensor | None:
    """Sorted indices of the share of a sample's visual positions whose IVSB states are stored
    (--ivsb-keep), drawn from the sample's line index so a rerun keeps the same; None: all."""
    if share >= 1.0 or n_vis == 0:
        return None
    keep = max(1, round(share * n_vis))
    return torch.randperm(n_vis, generator=torch.Generator().manual_seed(index))[:keep].sort().values
