"""The vLLM internals read by the modules both glues share (serving_draft.py's token I/O on the
target, engine_stats.py, batch_caption.py, training/step_cost.py, serving_layer.py's compiled
ops): one list, part of each runner's table (patches.PATCHES for the V1 runner,
v2_runner/vllm_reads.ROWS for the V2 one), so the start-up check and the source checker look for
them on every supported release. Those modules import vLLM when they load, so their rows live
here, grouped by reader.
"""

from __future__ import annotations

from .patch_helper import Read

_OPS = "vllm._custom_ops"
_SERVING = "serving_draft.py"

ROWS: tuple[Read, ...] = (
    # serving_draft.py: the target model, through its model class (differs per architecture)
    Read("<target model>.get_language_model", _SERVING,
         "the language model of a multimodal target (else the model itself)", "documented"),
    Read("<target language model>.embed_input_ids", _SERVING,
         "the target's embedding, shared with a draft that has none", "documented"),
    Read("<target model>.compute_logits", _SERVING, "the target's LM head, shared with a draft that has none",
         "documented"),
    Read("<target language model>.lm_head, .logits_processor", _SERVING,
         "the head's weight for a reduced draft vocabulary, used only when the logits are a plain matmul "
         "(else the full vocabulary; read with getattr)", "documented", required=False),
    # engine_stats.py: the drafter's accounting, through LLM.collective_rpc
    Read("vllm.v1.worker.gpu_worker.Worker.model_runner", "engine_stats.py, training/capture_worker.py",
         "the worker's runner: its drafter's Sparrow stats; the batch layout and model the capture hooks read",
         "instance"),
    Read("vllm.config.parallel.ParallelConfig.worker_extension_cls",
         "engine_stats.py, training/tune.py, training/capture_worker.py",
         "mixes StatsWorkerExtension (readings called by name across processes) or CaptureWorkerExtension "
         "into the worker (the engine argument)", "field"),
    # batch_caption.py: shutting its engine down
    Read("vllm.entrypoints.llm.LLM.llm_engine", "batch_caption.py", "the engine behind LLM", "instance"),
    Read("vllm.v1.engine.llm_engine.LLMEngine.engine_core", "batch_caption.py", "the engine-core client",
         "instance"),
    Read("vllm.v1.engine.core_client.EngineCoreClient.shutdown", "batch_caption.py",
         "stops the engine processes before the command reports (also on Ctrl-C)", "class"),
    Read("vllm.v1.engine.exceptions.EngineDeadError", "batch_caption.py",
         "the engine died (Ctrl-C reaches its process first): reported as an interrupted run", "class"),
    # training/step_cost.py: `sparrow tune` steps the engine itself to time its decode steps
    Read("vllm.v1.engine.llm_engine.LLMEngine.add_request", "training/step_cost.py",
         "queues a batch's requests together", "class"),
    Read("vllm.v1.engine.llm_engine.LLMEngine.step", "training/step_cost.py", "one engine step, timed", "class"),
    Read("vllm.v1.engine.llm_engine.LLMEngine.get_num_unfinished_requests", "training/step_cost.py",
         "only steps with the whole batch running are timed", "class"),
    Read("vllm.v1.engine.llm_engine.LLMEngine.abort_request", "training/step_cost.py",
         "ends the batch once its steps are timed", "class"),
    Read("vllm.v1.engine.llm_engine.LLMEngine.has_unfinished_requests", "training/step_cost.py",
         "steps until the aborted batch is gone", "class"),
    # serving_layer.py: vLLM's compiled ops (absent: torch's ops instead)
    Read(f"{_OPS}.rms_norm", "serving_layer.py", "the draft layer's RMSNorm", "class", required=False),
    Read(f"{_OPS}.fused_add_rms_norm", "serving_layer.py", "RMSNorm with the residual add fused in", "class",
         required=False),
    Read(f"{_OPS}.rotary_embedding", "serving_layer.py", "RoPE in place", "class", required=False),
    Read(f"{_OPS}.create_onednn_mm", "serving_layer.py", "a prepacked oneDNN GEMM for the draft's linears",
         "class", required=False, platform="cpu"),
    Read(f"{_OPS}.onednn_mm", "serving_layer.py", "runs the prepacked GEMM", "class", required=False,
         platform="cpu"),
    Read(f"{_OPS}._supports_onednn", "serving_layer.py", "whether this CPU build has oneDNN (read with getattr)",
         "class", required=False, platform="cpu"),
    Read("torch.ops._C.silu_and_mul", "serving_layer.py", "SiLU-and-multiply of the draft's MLP (CUDA build)",
         "documented", required=False, platform="cuda"),
)
