"""The target's hidden states from inside vLLM: a worker extension (vLLM's `worker_extension_cls`
engine argument) that records, for every request the engine prefills, what capture stores.

Capture runs each sample's prompt + response through the engine as one prompt (max_tokens=1),
so every state is computed once, batched with other samples' prefill chunks, and vLLM decodes
and embeds the video as it does when serving. Forward hooks on the target's decoder layers
record, per engine step:
  final      [T, H]  the language model's final norm output: what vLLM hands a proposer
  layer k    [T, H]  the residual stream entering decoder layer k (HF's hidden_states[k]): the
                     output of layer k - 1 (its hidden + residual), the embeddings for k = 0, and
                     for k = num_layers the final norm's output (HF's convention)
  positions  [T]     the rotary positions the layers ran with (M-RoPE: its temporal row), what
                     vLLM hands an EAGLE draft (only when asked: the EAGLE-style baseline's capture)
The step's rows are split per request by the runner's batch layout (request ids, row offsets,
tokens computed before the step); a request's rows are kept on the host until its prompt is
complete, then written as one safetensors file named by the engine's request id (token ids
[n], final [n, H], layer_<k> [n, H]) into the scratch folder capture reads. Only the first
worker writes (with tensor parallelism every rank holds the same states).

The step's layout is the runner's: the V1 runner's (vLLM 0.32, 0.33) persistent input batch, or on
the V2 runner (0.34) the InputBatch its prepare_inputs returns for the step, kept as it is made
(`StepLayout`). A request's token ids are its rows' tokens, step by step.

The hooks sit on modules (decoder layers, the final norm), not on the language model's forward,
which vLLM's compile decorator calls around nn.Module hooks; and they need an eager engine:
capture opens one with enforce_eager (captured CUDA graphs replay without Python).
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch

from ..durable import atomic_save_safetensors

STORE = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class CaptureWorkerExtension:
    """Mixed into vLLM's Worker by `worker_extension_cls`; called through LLM.collective_rpc."""

    def sparrow_capture_on(self, layer_ids: list[int], scratch: str, store_dtype: str, positions: bool = False) -> int:
        """Record `layer_ids` (and the final states; with `positions`, the rotary positions the
        layers ran with) of every prefilled request into `scratch`. Returns the number of layers."""
        self.sparrow_capture_off()
        model = self.model_runner.model
        lm = model.get_language_model() if hasattr(model, "get_language_model") else model  # multimodal or text
        base = lm.model  # the decoder stack: .layers, .norm
        self._sparrow_recorder = StepRecorder(self.model_runner, base, layer_ids, Path(scratch),
                                              STORE[store_dtype], writes=self.rank == 0, positions=positions)
        return len(base.layers)

    def sparrow_capture_off(self) -> None:
        recorder = getattr(self, "_sparrow_recorder", None)
        if recorder is not None:
            recorder.remove()
            self._sparrow_recorder = None


class StepLayout(NamedTuple):
    """The engine step the final norm just ran, request by request."""

    req_ids: list[str]  # [B]
    starts: list[int]  # [B + 1] row offsets
    computed: np.ndarray  # [B] tokens computed before the step
    prompt: np.ndarray  # [B] prompt length (a capture request's prompt is the whole sample)
    token_ids: np.ndarray  # [T] the step's tokens, in row order


class StepLayouts:
    """Reads each step's layout from the runner: the V1 runner keeps its input batch on itself;
    the V2 runner makes one per step in prepare_inputs, which is wrapped on the runner's own
    object (not its class) to keep the latest until `remove()`."""

    def __init__(self, runner) -> None:
        self.runner, self.v2 = runner, not hasattr(runner, "input_batch")
        if self.v2:
            inner = runner.prepare_inputs

            def keep(*args, **kwargs):
                runner._sparrow_step_batch = batch = inner(*args, **kwargs)
                return batch

            runner.prepare_inputs = keep

    def remove(self) -> None:
        if self.v2:
            del self.runner.prepare_inputs  # the class's method again
            self.runner.__dict__.pop("_sparrow_step_batch", None)

    def current(self) -> StepLayout:
        r = self.runner
        if not self.v2:
            batch = r.input_batch
            n = batch.num_reqs
            starts = r.query_start_loc.np[: n + 1].tolist()
            computed = np.asarray(batch.num_computed_tokens_cpu[:n], dtype=np.int64)
            rows = [batch.token_ids_cpu[i, c : c + hi - lo] for i, (c, lo, hi) in
                    enumerate(zip(computed, starts[:-1], starts[1:]))]
            return StepLayout(list(batch.req_ids[:n]), starts, computed,
                              np.asarray(batch.num_prompt_tokens[:n], dtype=np.int64),
                              np.concatenate(rows) if rows else np.zeros(0, dtype=np.int64))
        batch = r._sparrow_step_batch
        n = batch.num_reqs
        starts = batch.query_start_loc_np[: n + 1].astype(np.int64).tolist()
        return StepLayout(list(batch.req_ids[:n]), starts, batch.num_computed_tokens_np[:n].astype(np.int64),
                          r.req_states.prompt_len.np[batch.idx_mapping_np[:n]].astype(np.int64),
                          batch.input_ids[: starts[-1]].cpu().numpy().astype(np.int64))


class StepRecorder:
    def __init__(self, runner, base, layer_ids: list[int], scratch: Path, dtype: torch.dtype, writes: bool,
                 positions: bool = False) -> None:
        self.runner, self.scratch, self.dtype, self.writes = runner, scratch, dtype, writes
        self.num_layers = len(base.layers)
        self.step: dict[int | str, torch.Tensor] = {}  # layer id / "final" / "positions" -> this step's rows
        self.open: dict[str, dict] = {}  # request id -> {"final": [chunks], k: [chunks]}
        self.layer_ids = sorted(set(layer_ids))
        self.keys = ["final", *self.layer_ids] + (["positions"] if positions else [])
        self.layouts = StepLayouts(runner)
        self.handles = [base.norm.register_forward_hook(self._on_final)]
        if positions:  # what the layers rotate by: M-RoPE's temporal row, or the 1-D positions
            self.handles.append(base.layers[0].register_forward_pre_hook(self._positions))
        for k in self.layer_ids:
            if k == 0:  # the embeddings (vision merged) entering layer 0
                self.handles.append(base.layers[0].register_forward_pre_hook(self._entering_first))
            elif k < self.num_layers:
                self.handles.append(base.layers[k - 1].register_forward_hook(self._leaving(k)))

    def remove(self) -> None:
        for h in self.handles:
            h.remove()
        self.layouts.remove()

    def _host(self, x: torch.Tensor) -> torch.Tensor:
        """A host copy in the stored dtype: always a copy, since the layers after this one update
        their inputs in place (the first layer's input becomes the residual the next norm adds to)."""
        return x.detach().to(device="cpu", dtype=self.dtype, copy=True)

    def _positions(self, module, args):
        pos = args[0]  # [T] or, for M-RoPE, [3, T]
        self.step["positions"] = (pos[0] if pos.dim() == 2 else pos).detach().to("cpu", torch.long, copy=True)

    def _entering_first(self, module, args):
        self.step[0] = self._host(args[1])  # args: (positions, hidden_states, residual)

    def _leaving(self, k: int):
        def hook(module, args, out):
            hidden, residual = out  # the stream is their sum (the next layer's norm fuses the add, in place)
            self.step[k] = self._host(hidden + residual)
        return hook

    def _on_final(self, module, args, out):
        final = self._host(out[0] if isinstance(out, tuple) else out)  # [T_padded, H]
        self.step["final"] = final
        if self.num_layers in self.layer_ids:
            self.step[self.num_layers] = final
        step = self.layouts.current()
        self.step["token_ids"] = torch.from_numpy(step.token_ids)
        for i, rid in enumerate(step.req_ids):
            lo, hi = step.starts[i], step.starts[i + 1]
            computed = int(step.computed[i])
            if computed == 0 or rid not in self.open:  # a new request, or one preempted and recomputed
                self.open[rid] = {k: [] for k in ["token_ids", *self.keys]}
            parts = self.open[rid]
            for k in parts:
                parts[k].append(self.step[k][lo:hi])
            prompt = int(step.prompt[i])
            if computed + (hi - lo) >= prompt:  # its prompt is complete
                self._finish(rid, parts, prompt)
        self.step = {}

    def _finish(self, rid: str, parts: dict, prompt: int) -> None:
        del self.open[rid]
        if not self.writes:
            return
        tensors = {"token_ids": torch.cat(parts.pop("token_ids"))[:prompt].long()}
        tensors.update({k if isinstance(k, str) else f"layer_{k}": torch.cat(parts[k]) for k in self.keys})
        atomic_save_safetensors(self.scratch / f"{rid}.safetensors", tensors)
