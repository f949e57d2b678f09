"""The vLLM internals the V1 runner's glue relies on without patching them: what proposer.py
reads from the runner and from the EagleProposer it subclasses (and the methods it overrides),
and what the engine capture's worker extension reads (training/capture_worker.py, V1 only). What
the modules both glues share read is in ../shared_reads.py; the internals a patch's code reads
are declared beside that patch (method_patches.py, vllm_fixes.py).

patches.py checks at start-up that each row's target exists on the installed vLLM, as its `check`
says (patch_helper.CHECKS); a required one missing makes the plugin step aside, as the version
check does. vLLM's engine configuration (VllmConfig and its parts, as engine arguments set them)
and the LLM class's documented methods are its public interface and are not listed.
"""

from __future__ import annotations

from ..patch_helper import Read

_RUNNER = "vllm.v1.worker.gpu_model_runner.GPUModelRunner"
_BATCH = "vllm.v1.worker.gpu_input_batch.InputBatch"
_ATTN = "vllm.v1.attention.backend.CommonAttentionMetadata"
_SAMPLING = "vllm.v1.sample.metadata.SamplingMetadata"
_EAGLE = "vllm.v1.spec_decode.eagle.EagleProposer"  # its instance attributes are set by SpecDecodeBaseProposer
_PROPOSER = "v1_runner/proposer.py"
_CAPTURE = "training/capture_worker.py"


def _overridden(method: str, what: str) -> Read:
    return Read(f"{_EAGLE}.{method}", _PROPOSER, f"the runner calls it; SparrowProposer overrides it: {what}", "class")


ROWS: tuple[Read, ...] = (
    # proposer.py: the runner's host copies of the step (nothing is read back from the device)
    Read(f"{_RUNNER}.input_batch", _PROPOSER, "the persistent batch: per-request counts and tokens on the host",
         "instance"),
    Read(f"{_BATCH}.req_ids", f"{_PROPOSER}, {_CAPTURE}", "request ids in batch order: draft cache slots, released requests",
         "class"),
    Read(f"{_BATCH}.num_prompt_tokens", f"{_PROPOSER}, {_CAPTURE}", "prompt lengths: prompt rows vs decode rows, visual counts",
         "instance"),
    Read(f"{_BATCH}.num_computed_tokens_cpu", f"{_PROPOSER}, {_CAPTURE}",
         "tokens computed before the step: decode-only steps, text bounds, prompt chunks", "instance"),
    Read(f"{_BATCH}.token_ids_cpu", f"{_PROPOSER}, {_CAPTURE}",
         "prompt token ids: visual placeholders counted per request and per prompt chunk", "instance"),
    Read(f"{_RUNNER}.discard_request_mask", _PROPOSER,
         "requests mid-prefill this step (their sampled token is discarded): no drafts committed for them",
         "instance"),
    Read("vllm.v1.utils.CpuGpuBuffer.gpu", _PROPOSER, "the device side of discard_request_mask", "instance"),
    # proposer.py: the step's attention metadata and sampling metadata
    Read(f"{_ATTN}.num_reqs", _PROPOSER, "requests in the step", "field"),
    Read(f"{_ATTN}.query_start_loc", _PROPOSER, "[B + 1] device row offsets: query lengths, valid rows", "field"),
    Read(f"{_ATTN}.query_start_loc_cpu", _PROPOSER, "[B + 1] host row offsets: the packed layout of the step",
         "field"),
    Read(f"{_ATTN}.seq_lens", _PROPOSER, "[B] sequence lengths: each request's start position in the step",
         "field"),
    Read(f"{_SAMPLING}.all_greedy", _PROPOSER, "greedy drafting when every request is greedy", "field"),
    Read(f"{_SAMPLING}.temperature", _PROPOSER, "[B] temperatures for sampled drafts", "field"),
    Read(f"{_SAMPLING}.generators", _PROPOSER,
         "{batch row: torch.Generator seeded with the request's seed}: seeded requests' draft noise", "field"),
    # proposer.py: what the EagleProposer base sets up (SpecDecodeBaseProposer.__init__)
    Read(f"{_EAGLE}.vllm_config", _PROPOSER, "the engine's config (scheduler, model, parallel, compilation)",
         "instance"),
    Read(f"{_EAGLE}.speculative_config", _PROPOSER, "the draft directory (speculative_config.model)", "instance"),
    Read(f"{_EAGLE}.device", _PROPOSER, "where the draft and its cache live", "instance"),
    Read(f"{_EAGLE}.dtype", _PROPOSER, "the draft's and its cache's dtype (the target's)", "instance"),
    Read(f"{_EAGLE}.max_model_len", _PROPOSER, "sizes the text positions and the cache budget", "instance"),
    Read(f"{_EAGLE}.num_speculative_tokens", _PROPOSER, "draft depth K: cache rows, graph buckets, tree search",
         "instance"),
    Read(f"{_EAGLE}._enable_probabilistic_draft_probs", _PROPOSER,
         "whether the rejection sampler takes draft probabilities (else drafts are greedy)", "instance"),
    # proposer.py: set for the runner to read
    Read(f"{_EAGLE}.supports_mm_inputs", _PROPOSER,
         "set False: the runner gathers no visual embeddings for the draft", "instance"),
    Read(f"{_EAGLE}.kv_cache_gid", _PROPOSER, "set 0: the KV cache group whose attention metadata the runner "
         "hands over (the draft has no vLLM KV cache)", "instance"),
    Read(f"{_EAGLE}.draft_attn_groups", _PROPOSER, "set empty: no vLLM attention layers in the draft", "instance"),
    Read(f"{_EAGLE}._last_draft_probs", _PROPOSER,
         "set to the drafts' probabilities; the runner takes them with take_last_draft_probs()", "instance"),
    # proposer.py: the methods the runner calls, overridden
    _overridden("load_model", "loads the Sparrow draft and allocates its text-only window cache"),
    _overridden("initialize_attn_backend", "no vLLM attention backend for the draft"),
    _overridden("initialize_cudagraph_keys", "no vLLM graph wrappers: drafting/graphs.py captures the step"),
    _overridden("validate_same_kv_cache_group", "no draft KV cache to validate"),
    _overridden("dummy_run", "profiles the draft's largest step; captures its graphs"),
    _overridden("propose", "one draft step: the runner's step in, draft token ids out"),
    Read(f"{_EAGLE}.take_last_draft_probs", _PROPOSER,
         "not overridden: the runner reads _last_draft_probs through it", "class"),
    # training/capture_worker.py: the target's states inside the engine (a worker extension)
    # (ParallelConfig.worker_extension_cls, which mixes CaptureWorkerExtension in: shared_reads.py)
    Read("vllm.v1.worker.gpu_worker.Worker.rank", _CAPTURE, "only rank 0 writes the states", "instance"),
    Read(f"{_RUNNER}.model", _CAPTURE, "the target model the capture hooks", "instance"),
    Read(f"{_RUNNER}.query_start_loc", _CAPTURE, "[B + 1] host row offsets of the step being run", "instance"),
    Read(f"{_BATCH}.num_reqs", _CAPTURE, "requests in the step being run", "class"),
    Read("<target language model>.model.layers, .model.norm", _CAPTURE,
         "hooked: a decoder layer returns (hidden, residual), the stream is their sum; the final norm's output "
         "is what the proposer is handed (hooks on modules: vLLM's compile decorator bypasses the model's own)",
         "documented"),
)
