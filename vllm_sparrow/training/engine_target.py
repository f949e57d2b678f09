"""The target in vLLM, as capture needs it: many samples' states per engine run.

Each sample goes in as one prompt, its chat prompt's tokens followed by its response's, with its
decoded video (the frames the transformers capture hands HF's processor) and max_tokens=1: one
batched, chunked prefill computes every position's states, and the worker extension
(capture_worker.py) writes each request's rows to a scratch folder as its prefill completes.
The engine is eager (the hooks run in Python) and has no prefix cache (a cached prefix would be
skipped, and its states never computed).
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any, NamedTuple

import torch
from safetensors.torch import load_file

from .data import BadSample, load_media
from .target_runner import TargetInputs, eagle3_layer_ids

EXTENSION = "vllm_sparrow.training.capture_worker.CaptureWorkerExtension"


class EngineStates(NamedTuple):
    token_ids: torch.Tensor  # [n] prompt (visual placeholders expanded) + response
    final: torch.Tensor  # [n, H] after the final norm
    layers: dict[int, torch.Tensor]  # layer id -> [n, H] the stream entering that layer
    positions: torch.Tensor | None  # [n] rotary positions (M-RoPE: temporal row), when asked


def engine_args(max_seq_len: int, max_positions: int | None, user_args: dict[str, Any] | None = None) -> dict[str, Any]:
    """LLM(...) arguments of a capture engine: the user's (parallelism, memory, dtype), then what
    capture needs whatever they say (eager, no prefix cache, the worker extension)."""
    # + 1: a sample of max_seq_len tokens still leaves room for the one token a request must ask
    # for; never past the model's positions (vLLM refuses that)
    length = min(max_seq_len + 1, max_positions or max_seq_len + 1)
    # float32 unless told otherwise: as the transformers capture and sparrow respond run the target
    # max_num_batched_tokens >= the longest sample: vLLM sizes its encoder cache from it, and a
    # video with more visual tokens than the cache is refused (a 768 s clip's 12,288 tokens
    # against the CPU default's 4,096); a prompt is then prefilled in one step, as capture wants
    args = {"max_model_len": length, "limit_mm_per_prompt": {"image": 1, "video": 1}, "dtype": "float32",
            "max_num_batched_tokens": max(length, 8192), **(user_args or {})}
    args.update(enforce_eager=True, enable_prefix_caching=False, worker_extension_cls=EXTENSION)
    return args


class EngineTarget(TargetInputs):
    def __init__(self, target_dir: str, llm, inputs: TargetInputs | None = None) -> None:
        if inputs is None:
            super().__init__(target_dir)
        else:  # the prompt side capture loaded already (its processor): not loaded twice
            self.__dict__.update(vars(inputs))
        self.llm = llm  # opened with engine_args()
        self.scratch = Path(tempfile.mkdtemp(prefix="sparrow-capture-"))

    def close(self) -> None:
        shutil.rmtree(self.scratch, ignore_errors=True)

    def request(self, prompt: str, media_kind: str | None, media: Any, response: list[int]) -> dict:
        """The engine prompt of one sample: chat prompt tokens + response tokens, its media."""
        ids = self.tokenizer(self.chat_prompt(prompt, media_kind), add_special_tokens=False)["input_ids"]
        request: dict[str, Any] = {"prompt_token_ids": list(ids) + list(response)}
        if media_kind is not None:
            request["multi_modal_data"] = {media_kind: media}
        return request

    def answers(self, requests: list[dict], max_new_tokens: int) -> list[list[int] | Exception]:
        """The target's greedy answers (token ids, end-of-turn included), as HF's generate writes
        them (respond.greedy_params), or the reason vLLM refused the request."""
        from ..batch_caption import generate_each
        from .respond import greedy_params

        outputs = generate_each(self.llm, requests, greedy_params(self.llm, max_new_tokens))
        return [o if isinstance(o, Exception) else list(o.outputs[0].token_ids) for o in outputs]

    def states(self, requests: list[dict], layer_ids: list[int], store_dtype: str,
               positions: bool = False) -> list[EngineStates | Exception]:
        """Every request's states in one engine run, or the reason vLLM refused the request."""
        from vllm import SamplingParams

        from ..batch_caption import generate_each

        for f in self.scratch.glob("*"):
            f.unlink()
        self.llm.collective_rpc("sparrow_capture_on", args=(layer_ids, str(self.scratch), store_dtype, positions))
        try:
            outputs = generate_each(self.llm, requests, SamplingParams(max_tokens=1, temperature=0.0))
        finally:
            self.llm.collective_rpc("sparrow_capture_off")
        files = {f.stem.split("-")[0]: f for f in self.scratch.glob("*.safetensors")}  # engine ids: "<id>-<suffix>"
        return [o if isinstance(o, Exception) else self._read(files.get(o.request_id), layer_ids) for o in outputs]

    def _read(self, path: Path | None, layer_ids: list[int]) -> EngineStates | Exception:
        if path is None:  # the engine ran it, the extension wrote nothing: a bug, said per sample
            return RuntimeError("the engine wrote no states for this request")
        t = load_file(str(path))
        path.unlink()
        return EngineStates(t["token_ids"], t["final"], {k: t[f"layer_{k}"] for k in layer_ids}, t.get("positions"))


def engine_chunk(target: EngineTarget, samples: list, cfg) -> list[dict | BadSample]:
    """The stored tensors (or the reason to skip) of each of `samples` (Sample or BadSample):
    media decoded, missing responses written by the engine, then one batched prefill of them all."""
    from .stored import given_response, stored_tensors

    results: list[dict | BadSample | None] = [s if isinstance(s, BadSample) else None for s in samples]
    media = _decode_once(samples, results, cfg.num_frames)
    live = [i for i in range(len(samples)) if results[i] is None]
    responses = {i: given_response(target, samples[i], cfg) for i in live}
    asked = [i for i in live if responses[i] is None]
    for i, answer in zip(asked, target.answers([target.request(samples[i].prompt, samples[i].media_kind, media[i], [])
                                                for i in asked], cfg.max_new_tokens)):
        responses[i] = answer
    live = [i for i in live if _has_response(samples[i], responses, results, i)]
    aux_layers = eagle3_layer_ids(target.num_layers) if cfg.eagle3 else ()
    layer_ids = sorted({cfg.ivsb_layer, *aux_layers})
    requests = [target.request(samples[i].prompt, samples[i].media_kind, media[i], responses[i]) for i in live]
    for i, states in zip(live, target.states(requests, layer_ids, cfg.store_dtype, positions=cfg.eagle_baseline)):
        s = samples[i]
        if isinstance(states, Exception):
            results[i] = refused(s, states)
            continue
        aux = torch.cat([states.layers[k] for k in aux_layers], -1) if aux_layers else None
        prompt_len = states.token_ids.shape[0] - len(responses[i])
        tensors = stored_tensors(cfg, s.index, target.spec.visual_token_ids, states.token_ids, prompt_len, states.final,
                                 states.layers[cfg.ivsb_layer], aux, aux_layers)
        if cfg.eagle_baseline:  # what the EAGLE-style baseline reads: final states everywhere, positions
            tensors["visual_final"] = states.final[tensors["is_visual"]]  # [n_vis, H]
            tensors["positions"] = states.positions  # [n]
        results[i] = tensors
    return results


def _decode_once(samples: list, results: list, num_frames: int) -> dict[int, Any]:
    """Decoded media by sample position, each file decoded once however many samples ask about it
    (datasets hold several questions per video); an undecodable file marks its samples bad."""
    decoded: dict[tuple, Any] = {}  # (kind, path) -> media, or the error decoding it raised
    media: dict[int, Any] = {}
    for i, s in enumerate(samples):
        if results[i] is not None:
            continue
        key = (s.media_kind, s.media_path)
        if key not in decoded:
            try:
                decoded[key] = load_media(s, num_frames)
            except ValueError as e:  # missing/corrupt media (VideoDecodeError is a ValueError)
                decoded[key] = e
        if isinstance(decoded[key], ValueError):
            results[i] = BadSample(s.index, "undecodable media", str(decoded[key]))
        else:
            media[i] = decoded[key]
    return media


def refused(sample, error: Exception) -> BadSample:
    """Why vLLM refused a sample's request, as capture's skip reasons say it."""
    text = str(error)
    if "longer than the maximum model length" in text:  # the transformers path's check, made by vLLM
        first = text.split(". ")[0]
        return BadSample(sample.index, "over-long sample", f"{first} (max_seq_len + 1); use fewer frames")
    return BadSample(sample.index, "target error", f"{type(error).__name__}: {text}")


def _has_response(sample, responses: dict, results: list, i: int) -> bool:
    if isinstance(responses[i], Exception):
        results[i] = refused(sample, responses[i])
    elif not responses[i]:
        results[i] = BadSample(sample.index, "empty response", "the target produced no tokens")
    else:
        return True
    return False
